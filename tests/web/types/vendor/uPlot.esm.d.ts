// The types of the dashboard's uPlot (web/app/charts.js imports ./vendor/uPlot.esm.js, which the build embeds from
// web/node_modules/uplot/dist): uPlot's own declarations. tsconfig.json's rootDirs lay this folder over web/app.
import uPlot = require('../../../../web/node_modules/uplot/dist/uPlot');
export default uPlot;

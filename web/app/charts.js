// Line charts over uPlot (embedded from web/node_modules at build, served at /ui/vendor/). Each chart's container
// carries data-points (the number of finite points drawn) so tests and people can tell a curve grew.

/** @typedef {import('./vendor/uPlot.esm.js').default} UPlot */
/** @type {typeof import('./vendor/uPlot.esm.js').default | null} */
let uPlotModule = null;
const uPlotReady = import('./vendor/uPlot.esm.js')
  .then((m) => {
    uPlotModule = m.default;
  })
  .catch(() => {
    uPlotModule = null;  // built without web/node_modules: charts show as tables of numbers instead
  });

/** @param {string} name */
function cssVar(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

// Steps and rounds are whole numbers: x ticks never fall between them.
const INTEGER_STEPS = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000];

// Colours are read from CSS when a plot is built, so every chart is rebuilt when the system's scheme changes.
const liveCharts = new Set();
matchMedia('(prefers-color-scheme: dark)').addEventListener('change', () => {
  for (const chart of liveCharts) chart.rebuild();
});

const PALETTE = ['--series-1', '--series-2', '--series-3', '--series-4', '--series-5', '--series-6'];
/** @param {number} index */
export function seriesColor(index) {
  return cssVar(PALETTE[index % PALETTE.length]) || '#3366cc';
}

// A chart of one x axis and one or more y series, resized with its container.
//   new LineChart(container, {xLabel, yLabel, series: [{label, colorIndex}], height})
//   chart.setData(xs, [ys0, ys1, ...])  (null for a missing y)
export class LineChart {
  /**
   * @param {HTMLElement} container
   * @param {{xLabel: string, yLabel: string, series: {label: string, colorIndex?: number}[], height?: number}} options
   */
  constructor(container, { xLabel, yLabel, series, height = 180 }) {
    this.container = container;
    this.options = { xLabel, yLabel, series, height };
    /** @type {[number[], ...(number | null)[][]]} */
    this.data = [[], ...series.map(() => [])];
    /** @type {UPlot | null} */
    this.plot = null;
    this.container.classList.add('chart');
    this.container.dataset.points = '0';
    /** @type {HTMLElement | null} */
    this.fallback = null;
    uPlotReady.then(() => this.render());
    this.resizeObserver = new ResizeObserver(() => this.resize());
    this.resizeObserver.observe(container);
    liveCharts.add(this);
  }

  rebuild() {
    if (this.plot) this.plot.destroy();
    this.plot = null;
    this.render();
  }

  /** @param {number[]} xs @param {(number | null)[][]} ys  one list per series, null where it has no point */
  setData(xs, ys) {
    this.data = [xs, ...ys];
    let points = 0;
    for (const y of ys) points += y.filter((v) => v !== null && Number.isFinite(v)).length;
    this.container.dataset.points = String(points);
    if (this.plot) this.plot.setData(this.data);
    else this.render();
  }

  width() {
    return Math.max(200, Math.floor(this.container.clientWidth));
  }

  render() {
    if (!uPlotModule) {
      if (!this.fallback) {
        this.fallback = document.createElement('p');
        this.fallback.className = 'muted';
        this.container.append(this.fallback);
      }
      const last = this.data[0].length ? this.data[0].length - 1 : -1;
      this.fallback.textContent =
        last < 0 ? 'No points yet.' : `Latest: ${this.data.slice(1).map((s) => fmtNumber(s[last])).join(', ')}`;
      return;
    }
    if (this.plot || this.container.clientWidth === 0) return;
    const axis = {
      stroke: cssVar('--text-muted'),
      grid: { stroke: cssVar('--grid'), width: 1 },
      ticks: { stroke: cssVar('--grid'), width: 1 },
    };
    this.plot = new uPlotModule(
      {
        width: this.width(),
        height: this.options.height,
        legend: { show: this.options.series.length > 1 },
        cursor: { drag: { x: false, y: false } },
        scales: { x: { time: false } },
        axes: [
          { ...axis, label: this.options.xLabel, incrs: INTEGER_STEPS },
          { ...axis, label: this.options.yLabel, size: 56 },
        ],
        series: [
          { label: this.options.xLabel },
          ...this.options.series.map((s, i) => ({
            label: s.label,
            stroke: seriesColor(s.colorIndex ?? i),
            width: 2,
            spanGaps: true,
            points: { show: true, size: 4 },
          })),
        ],
      },
      this.data,
      this.container,
    );
  }

  resize() {
    if (!this.plot) {
      this.render();
      return;
    }
    this.plot.setSize({ width: this.width(), height: this.options.height });
  }

  destroy() {
    liveCharts.delete(this);
    this.resizeObserver.disconnect();
    if (this.plot) this.plot.destroy();
  }
}

/** @param {number | null | undefined} v @param {number} [digits] */
export function fmtNumber(v, digits = 4) {
  if (v === null || v === undefined || !Number.isFinite(v)) return '—';
  if (Math.abs(v) >= 1000) return v.toFixed(0);
  return Number(v.toPrecision(digits)).toString();
}

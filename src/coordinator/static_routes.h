// The dashboard's static files (web/, embedded at build): GET / is its page, GET /ui/<path> its scripts, styles
// and uPlot. Open routes: the page holds no data; it asks for the API key and calls /api/v1 with it. They are
// added to the router directly, not to the service's route table, because docs/openapi.yaml describes the API only.
#pragma once

#include "base/status.h"
#include "http/server.h"

namespace parsyn::coordinator {

// Adds GET / and GET /ui/{path...}. Errors: those of Router::Add (a duplicate route).
Status AddStaticRoutes(http::Router& router);

}  // namespace parsyn::coordinator

/* a planted use: the engine switching on the kind */
static int planted(int k) { return k == AKV_ROUTE_STAGED; }

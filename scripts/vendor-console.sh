#!/usr/bin/env bash
# Refreshes the console's vendored front-end files (htmx, uPlot) from npm: edit the versions in
# crates/tessera-server/console/package.json, run this script, commit package-lock.json and
# crates/tessera-server/console/assets/vendor/. The server embeds those files at build time;
# nothing is fetched at run time and no build step runs beyond `cargo`.
set -euo pipefail
cd "$(dirname "$0")/../crates/tessera-server/console"
npm install --no-audit --no-fund --silent
v=assets/vendor
mkdir -p "$v"
cp node_modules/htmx.org/dist/htmx.min.js "$v/htmx.min.js"
cp node_modules/htmx.org/LICENSE "$v/htmx.LICENSE"
cp node_modules/uplot/dist/uPlot.iife.min.js "$v/uPlot.iife.min.js"
cp node_modules/uplot/dist/uPlot.min.css "$v/uPlot.min.css"
cp node_modules/uplot/LICENSE "$v/uPlot.LICENSE"
echo "vendored: htmx $(node -p 'require("./node_modules/htmx.org/package.json").version'), uPlot $(node -p 'require("./node_modules/uplot/package.json").version')"

#!/usr/bin/env bash
# Node: npm install of local tarballs (cache in ~/.npm), npm test.
set -euo pipefail
cd "$WL_DIR"
mkdir -p lib app
cd lib
printf '{"name":"wl-lib","version":"1.0.0","main":"index.js"}\n' > package.json
printf 'module.exports = (a, b) => a + b;\n' > index.js
npm pack --silent >/dev/null
cd ../app
printf '{"name":"wl-app","version":"1.0.0","scripts":{"test":"node test.js"}}\n' > package.json
printf 'const add = require("wl-lib");\nif (add(2, 3) !== 5) process.exit(1);\nconsole.log("add ok");\n' > test.js
npm install --offline --no-audit --no-fund --silent ../lib/wl-lib-1.0.0.tgz
npm test --silent | grep "add ok"
echo node-ok

#!/usr/bin/env bash
# Network: an HTTP server on loopback reached by name ($WL_HTTP_NAME,
# allowed in the sandbox's DNS list) through the DNS proxy.
set -euo pipefail
cd "$WL_DIR"
curl -sf --max-time 10 "http://$WL_HTTP_NAME:$WL_HTTP_PORT/hello" -o hello.txt
grep -q hello-from-loopback hello.txt
python3 -c "import socket,sys; print(socket.getaddrinfo(sys.argv[1], 80)[0][4][0])" "$WL_HTTP_NAME" | grep 127.0.0.1
echo net-ok

#!/usr/bin/env bash
# Debian's Chromium for the browser test (Playwright drives it with executable_path; no
# browser download). Skipped when chromium is already installed or apt is unavailable.
set -uo pipefail
if command -v chromium >/dev/null 2>&1; then exit 0; fi
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium ffmpeg) >/dev/null 2>&1 \
    || echo "warning: could not install chromium; browser tests will fail" >&2
fi
exit 0

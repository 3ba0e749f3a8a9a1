#!/usr/bin/env bash
# Install (or check) a headless Chromium for the report's browser test (tests/test_report_browser.py).
#
#   sudo .ci/setup_chromium.sh        # as root; safe to run again (does nothing when chromium works)
#
# What it does, each step only when needed:
#   1. installs Debian's `chromium` package (apt-get, non-interactive; `apt-get update` and a retry
#      when the first try fails), which gives /usr/bin/chromium. Nothing else is downloaded: the test
#      drives this binary through the `playwright` Python package (in the `test` extra) and never
#      runs `playwright install`;
#   2. checks that the binary starts headless and renders a page (--dump-dom of a data: URL).
#
# Exits 0 when chromium works; otherwise non-zero with a message naming the step that failed and
# the log to read. Without it the browser test skips, saying why. Knobs:
#   CHROMIUM   the binary to use (default: chromium on PATH, else /usr/bin/chromium)
set -euo pipefail

LOG=/tmp/chromium-setup-apt.log
log() { echo "[chromium-setup] $*"; }
die() { echo "[chromium-setup] ERROR: $*" >&2; exit 1; }

find_chromium() { command -v "${CHROMIUM:-chromium}" 2>/dev/null || { [ -x /usr/bin/chromium ] && echo /usr/bin/chromium; } || true; }

BIN="$(find_chromium)"
if [ -z "$BIN" ]; then
    [ "$(id -u)" -eq 0 ] || die "chromium is not installed and installing it needs root; try: sudo $0"
    command -v apt-get >/dev/null 2>&1 || die "chromium is not installed and there is no apt-get; install Chromium by hand and set CHROMIUM=/path/to/it"
    log "installing Debian's chromium package (log: $LOG)"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -q chromium >"$LOG" 2>&1; then
        log "apt-get install failed; retrying after apt-get update"
        apt-get update -q >>"$LOG" 2>&1 || true
        apt-get install -y -q chromium >>"$LOG" 2>&1 || die "apt-get install chromium failed; see $LOG"
    fi
    BIN="$(find_chromium)"
    [ -n "$BIN" ] || die "the chromium package installed but no chromium binary was found; see $LOG"
fi

# The flags the test uses: no sandbox (root in CI), no GPU, and nothing that phones home (the
# machine's closed network otherwise fills the log with refused connections).
PROFILE="$(mktemp -d)"
trap 'rm -rf "$PROFILE"' EXIT
if ! out="$(timeout 60 "$BIN" --headless --no-sandbox --disable-gpu --disable-background-networking \
        --disable-component-update --no-first-run --disable-sync --user-data-dir="$PROFILE" \
        --dump-dom 'data:text/html,<p id=ok>mklscale</p>' 2>/dev/null)"; then
    die "$BIN did not start headless (run it by hand with --headless --no-sandbox --dump-dom about:blank to see why)"
fi
case "$out" in
    *'id="ok"'*) log "ready: $("$BIN" --version 2>/dev/null || echo "$BIN")" ;;
    *) die "$BIN started but rendered nothing; output: ${out:0:200}" ;;
esac

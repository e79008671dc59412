#!/usr/bin/env bash
# Idempotent set-up for tests and the quickstart: Debian packages and Python packages.
# Fast when everything is already present. Python packages come from the local wheel cache
# when the machine has one (pip is configured for it), else from the configured index.
set -euo pipefail
want_apt=()
command -v bwrap >/dev/null 2>&1 || want_apt+=(bubblewrap)
# The official Prometheus client's text-format parser reads /metrics in the tests (Debian's
# package, for Debian's python3: tests/_prometheus_parse.py finds an interpreter that has it).
python3 -c 'import prometheus_client' >/dev/null 2>&1 ||
  /usr/bin/python3 -c 'import prometheus_client' >/dev/null 2>&1 ||
  want_apt+=(python3-prometheus-client)
# A headless browser for the status page tests (driven by puppeteer-core from npm).
command -v chromium >/dev/null 2>&1 || want_apt+=(chromium)
# Certificates for the TLS tests (tests/tls_test.ts makes a CA and server certificates).
command -v openssl >/dev/null 2>&1 || want_apt+=(openssl)
if [ ${#want_apt[@]} -gt 0 ]; then
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  echo "setup: installing Debian packages: ${want_apt[*]}" >&2
  $sudo_cmd apt-get install -y -qq "${want_apt[@]}" >/dev/null 2>&1 || {
    $sudo_cmd apt-get update -qq >/dev/null && $sudo_cmd apt-get install -y -qq "${want_apt[@]}" >/dev/null
  }
fi
py=${KCORAL_PYTHON:-python3}
if ! "$py" -c 'import numpy, pytest, torch, ml_dtypes' >/dev/null 2>&1; then
  echo "setup: installing Python packages: numpy pytest torch ml_dtypes" >&2
  "$py" -m pip install -q numpy pytest torch ml_dtypes
fi

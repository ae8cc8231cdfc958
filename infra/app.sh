#!/bin/sh
# The CDK app as cdk.json runs it: the project's own Python (.venv), whether or not a virtualenv is active, so
# `npx cdk synth|bootstrap|deploy` work from the project folder as they are (the CLI runs the app for bootstrap
# too). POSIX sh: the one interpreter every machine that runs the CDK CLI has (macOS has no `python`).
here=$(CDPATH='' cd -- "$(dirname -- "$0")/.." && pwd) || exit 64
python="$here/.venv/bin/python"
if [ ! -x "$python" ]; then
  echo "error: no Python environment at $here/.venv: run \`make setup-deploy\` there first (needs Python 3.11+ and Node.js)" >&2
  exit 64
fi
exec "$python" -m infra.app "$@"

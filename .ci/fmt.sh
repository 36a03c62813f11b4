#!/usr/bin/env bash
. "$(dirname "$0")/lib.sh"
step fmt cargo fmt --all -- --check

#!/bin/bash
# The build with the compressed pool's defaults before (a 50% share, pages that
# compress poorly passed on to the file): BIN=binary old-defaults.sh bench ARGS...
exec "${BIN:?the build}" "$@" --compressed-max 50 --incompressible pass

#!/usr/bin/env bash
# Prints the CMake generator arguments for build folder $1: Ninja where it is installed (it starts
# a test's compiles while the engine's libraries still compile, where make waits for each target
# whole), unless the folder was already configured with another generator (CMake refuses a switch).
dir=$1
if [ -f "$dir/CMakeCache.txt" ]; then
  exit 0
fi
if command -v ninja >/dev/null; then echo "-G Ninja"; fi

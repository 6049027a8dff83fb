#!/bin/sh
[ "$(./add.sh 2 3)" = 5 ] && echo PASS || { echo FAIL; exit 1; }

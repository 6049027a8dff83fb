#!/bin/sh
# add two numbers
echo $(( $1 - $2 ))

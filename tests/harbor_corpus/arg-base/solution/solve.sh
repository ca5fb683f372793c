#!/bin/bash
tail -n +2 /app/orders.csv | awk -F, '{ sum += $2 } END { print sum }' > /app/total.txt

#!/bin/bash
sed -i 's/a - b/a + b/' /app/calc.py

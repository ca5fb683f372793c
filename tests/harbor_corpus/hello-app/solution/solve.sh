#!/bin/bash
printf 'Good morning, harbor.\n' > greeting.txt

"""What a local sandbox runs on: the image store, the one budget for what images leave on the machine, the base
image, and task images built offline."""

"""Training: the step, optimizer, devices and processes, few labels, the loop, callbacks,
checkpoints."""

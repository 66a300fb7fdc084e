"""ktrain-plugin-fused-loss: the output layer and the cross entropy in one autograd function."""

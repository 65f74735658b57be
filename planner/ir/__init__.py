"""The graph IR: tensors and ops, the model zoo and its configs, the numpy reference."""

"""`matmul`: NumPy semantics, PyTorch tensors, plans, the choice of kernel (record, prediction, cuBLAS), the online guard, explain."""

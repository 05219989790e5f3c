"""`matmul` and `explain`: how a call picks its kernel and runs it.

A call goes dispatch -> planning (`Dispatcher`) -> select -> results (the cache, the predictor), in
this order:

1. The fast paths (`dispatch.matmul`'s first two branches). A repeated call with a fresh output
   (no `out`, `tune`, `race` or `beta`) whose plan is known skips validation: on CuPy arrays the
   plan is found in `Dispatcher.fast` by `planning.fast_key` and run by `plan.Plan.call_fast`; on
   PyTorch CUDA tensors in `Dispatcher.torch_fast` by `torch_fast_path.torch_fast_key` and run by
   `Plan.call_torch` on PyTorch's current stream, or, where cuBLAS serves two tensors of one dtype, by
   torch.matmul itself (`Plan.torch_matmul`; float32 only while PyTorch computes it in float32).
   Either gives the call back to the general path where the current device or the operands'
   alignment differ from the plan's, or (CuPy) where the stream is being captured into a CUDA graph.
2. The general path. Tensors are seen as CuPy arrays through DLPack (`torch_tensors.call`, which
   then registers the plan for the torch fast path: `torch_fast_path.register`). `numpy_semantics`
   puts the call in the kernels' terms (1-D operands, broadcast batches, mixed dtypes; integer,
   boolean and complex operands go to cupy.matmul), the operands are validated
   (`gpu.operands.validate`), and `dispatch._gemm` runs the GEMM of 2-D or 3-D operands.
3. The plan memo (`planning.Dispatcher.plan_for`): one plan per (shapes, strides, dtype, compute,
   alignment, device, out's layout, tune, race), least recently used out first; one thread builds
   a plan while the others asking for it wait. `plan.make_plan` builds it: the choice of kernel,
   its launcher (or cuBLAS's), the copies an operand or `out` needs.
4. The choice (`Dispatcher.select` -> `select.choose`), in this order of trust, its origin named by
   `select.ChoiceSource`:
   a. the exact record of the problem on this GPU, the user cache's before the shipped one
      ("cache", "shipped cache"): a generated kernel, or cuBLAS where the tune kept it; with
      `tune=True` and no record, the problem is tuned first ("autotune");
   b. else the prediction (`results.predict`): a tuned config the model expects to beat cuBLAS on
      this shape by a margin, served under the online guard ("predicted"); with `race=True`, a
      problem without a record races the model's best few configs against cuBLAS on its first
      call instead, and the winner serves ("race", `race.py`);
   c. else cuBLAS ("cublas"): cuBLASLt, or cublasGemmEx where the problem's record measured it
      faster (`select.cublas_api`). Only a dtype cuBLAS is not asked to serve gets the family's
      built-in config ("default").
5. The online guard (`guard.Guard`): a kernel not measured against cuBLAS on this problem under the
   current timing protocol (a prediction, a record of an older protocol) alternates with cuBLAS
   on the problem's first calls, timed by CUDA events; the faster keeps the plan. A kernel that
   lost gives way to cuBLAS for the process ("guard") and the loss is written to the user cache
   (`guard.remember_loss`). An untuned problem's cuBLAS call is settled the same way, cuBLASLt
   against cublasGemmEx.
6. CUDA graph capture (`gpu/capture.py`): under a capture only a plan made before it serves (a call
   without one raises CaptureError before touching the GPU); its buffers come from the graph's
   memory (the CuPy fast path hands such a call to the general path; the torch fast path takes its
   output from the graph's pool and keeps no spare), and the guard serves its fallback untimed.

`explain` runs the same validation and selection as `matmul` (the races and guard verdicts of this
process included) without launching anything.
"""

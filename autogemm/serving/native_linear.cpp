// The memo in C++ of the calls PyTorch's own calls serve (serving/native_linear.py builds and loads it): for
// a layer that eager's calls serve (serving/eager_epilogue.py), a repeated `autogemm.linear` call runs those
// ATen calls, F.linear and then the activation and the residual in place (or the Python route's own calls),
// with no Python between them; a repeated `autogemm.matmul` of a product handed to torch.matmul runs at::matmul.
//
// Why C++: on an H200's host such a layer's GEMM can take less time than the Python around it. Eager's
// F.gelu(F.linear(x, w, b)) is two calls from Python; the same two from Python behind linear's key and
// lookup cost 2-4 us more a call. Here the key is the operands' metadata read in C++, and the ATen calls
// are made without Python's argument parsing.
//
// The memo holds keys: the operands' shapes, strides, dtypes and devices, whether there is a bias
// and a residual (and theirs), and the activation. Python files a key after its own route served the call
// (Memo.file, Memo.file_matmul) and says how the memo serves it (native_linear.route): eager's calls, or the
// Python route's own (its cuBLASLt call, the residual read as C; F.linear and its pass). ATen checks and
// computes any operands as eager would, so a key decides only the route, never the arithmetic on the operands
// it admits. A call the memo does not hold, or one with a tensor that requires grad, a __torch_function__
// subclass or mode, or an activation it does not know, gets None: the Python path serves it (or names its
// fault).
//
// F.linear's own cuBLASLt call, and the Python route's (the residual read as C; or the heuristic's runner-up
// that the layer's tune timed faster), prepared once per key: PreparedLinear (native_prepared_linear.h). The
// Python route's pass after F.linear, for a layer with a pass on a large output or on one token: PreparedPass
// (native_prepared_pass.h), behind F.linear's call prepared where F.linear adds the bias, or the bare GEMM's
// where the pass does and its bits are at::linear's. The generated kernel a tune with the layer's epilogue kept:
// PreparedKernel (native_prepared_kernel.h).
#include <torch/extension.h>
#include <torch/csrc/autograd/python_variable.h>
#include <ATen/PythonTorchFunctionTLS.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "native_prepared_kernel.h"
#include "native_prepared_linear.h"
#include "native_prepared_pass.h"

namespace {

// the activations of autogemm.epilogue.ACTIVATIONS, as eager computes them (F.relu, F.gelu, F.silu)
enum Activation : int64_t { kNone = 0, kRelu = 1, kGelu = 2, kGeluTanh = 3, kSilu = 4, kUnknown = -1 };

Activation activation_of(PyObject* name) {
  if (name == Py_None) return kNone;
  if (!PyUnicode_Check(name)) return kUnknown;
  if (PyUnicode_CompareWithASCIIString(name, "gelu") == 0) return kGelu;
  if (PyUnicode_CompareWithASCIIString(name, "silu") == 0) return kSilu;
  if (PyUnicode_CompareWithASCIIString(name, "gelu_tanh") == 0) return kGeluTanh;
  if (PyUnicode_CompareWithASCIIString(name, "relu") == 0) return kRelu;
  return kUnknown;
}

using Words = c10::SmallVector<int64_t, 48>;

struct WordsHash {
  size_t operator()(const Words& words) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the words
    for (int64_t w : words) {
      h ^= static_cast<uint64_t>(w);
      h *= 1099511628211ull;
    }
    return static_cast<size_t>(h);
  }
};

struct WordsEqual {
  bool operator()(const Words& a, const Words& b) const { return a == b; }
};

// A tensor's part of the key; false where the object is none the memo serves (not a torch.Tensor or
// nn.Parameter: a subclass may compute otherwise; not strided: no strides to key on).
bool add_tensor(Words& words, PyObject* object) {
  if (!THPVariable_CheckExact(object)) return false;
  const at::Tensor& t = THPVariable_Unpack(object);
  if (t.layout() != at::kStrided || t.is_nested()) return false;
  words.push_back(t.dim());
  for (int64_t s : t.sizes()) words.push_back(s);
  for (int64_t s : t.strides()) words.push_back(s);
  words.push_back(static_cast<int64_t>(t.scalar_type()));
  words.push_back(static_cast<int64_t>(t.device().type()));
  words.push_back(t.device().index());
  return true;
}

// what a key is of: a call of linear, or of matmul handed to torch.matmul
enum Call : int64_t { kLinear = 1, kMatmul = 2 };

// The key of a linear call (false: the memo cannot serve it). A missing bias or residual is a word of its own.
bool key_of(Words& words, PyObject* x, PyObject* weight, PyObject* bias, PyObject* activation,
            PyObject* residual, Activation& act) {
  act = activation_of(activation);
  if (act == kUnknown) return false;
  words.push_back(kLinear);
  words.push_back(act);
  if (!add_tensor(words, x) || !add_tensor(words, weight)) return false;
  for (PyObject* optional : {bias, residual}) {
    if (optional == Py_None) {
      words.push_back(-1);
    } else if (!add_tensor(words, optional)) {
      return false;
    }
  }
  return true;
}

// A tensor that requires grad is refused by the Python path (autogemm records no autograd graph), grad mode
// on or off: the memo leaves it to that refusal.
bool requires_grad(PyObject* x, PyObject* weight, PyObject* bias, PyObject* residual) {
  for (PyObject* object : {x, weight, bias, residual}) {
    if (object != Py_None && THPVariable_Unpack(object).requires_grad()) return true;
  }
  return false;
}

// The key of a matmul call (false: the memo cannot serve it).
bool matmul_key_of(Words& words, PyObject* a, PyObject* b) {
  words.push_back(kMatmul);
  return add_tensor(words, a) && add_tensor(words, b);
}

class Memo {
 public:
  // The calls keep the GIL: they only launch, and on an H200's host releasing it around them cost about 1 us
  // of a call's latency (journal, session 56: probe13)
  // The cuBLASLt workspace each route's calls get, as the heuristic picks by it: `linear_workspace_bytes`
  // F.linear's (PyTorch's), `lt_workspace_bytes` the Python route's cuBLASLt plan's (autogemm's);
  // `prepare`: whether keys get their cuBLASLt call prepared (False: at::linear serves every key)
  Memo(size_t max_entries, size_t linear_workspace_bytes, size_t lt_workspace_bytes, bool prepare)
      : max_entries_(max_entries),
        linear_workspace_bytes_(linear_workspace_bytes),
        lt_workspace_bytes_(lt_workspace_bytes),
        prepare_(prepare) {}

  // torch.matmul(a, b) where the memo holds the call's key, else None
  py::object matmul(py::handle a, py::handle b) {
    if (at::impl::torch_function_mode_enabled()) return py::none();
    Words words;
    if (!matmul_key_of(words, a.ptr(), b.ptr()) || !find(words)) return py::none();
    if (requires_grad(a.ptr(), b.ptr(), Py_None, Py_None)) return py::none();
    const at::Tensor& at_ = THPVariable_Unpack(a.ptr());
    const at::Tensor& bt = THPVariable_Unpack(b.ptr());
    return py::reinterpret_steal<py::object>(THPVariable_Wrap(at::matmul(at_, bt)));
  }

  bool file_matmul(py::handle a, py::handle b) {
    Words words;
    if (!matmul_key_of(words, a.ptr(), b.ptr())) return false;
    insert(std::move(words), nullptr);
    return true;
  }

  // linear(x, weight, bias, activation, residual) where the memo holds the call's key (eager's calls, or the
  // key's prepared cuBLASLt call), else None
  py::object linear(py::handle x, py::handle weight, py::handle bias, py::handle activation,
                    py::handle residual) {
    if (at::impl::torch_function_mode_enabled()) return py::none();  // (a mode would see eager's calls)
    Words words;
    Activation act;
    if (!key_of(words, x.ptr(), weight.ptr(), bias.ptr(), activation.ptr(), residual.ptr(), act)) {
      return py::none();
    }
    Entry entry;
    if (!find(words, &entry)) return py::none();
    if (requires_grad(x.ptr(), weight.ptr(), bias.ptr(), residual.ptr())) return py::none();
    const at::Tensor& xt = THPVariable_Unpack(x.ptr());
    const at::Tensor& wt = THPVariable_Unpack(weight.ptr());
    c10::optional<at::Tensor> bt;
    if (!bias.is_none()) bt = THPVariable_Unpack(bias.ptr());
    const at::Tensor* rt = residual.is_none() ? nullptr : &THPVariable_Unpack(residual.ptr());
    const at::Tensor none;
    const at::Tensor& b = bt ? *bt : none;
    const at::Tensor& r = rt != nullptr ? *rt : none;
    if (entry && entry->kernel) {  // the tuned kernel, its epilogue in its store (or the Python route's way)
      at::Tensor y = (*entry->kernel)(xt, wt, b, r);
      if (!y.defined()) return py::none();
      return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(y)));
    }
    if (entry && entry->pass) {  // the Python route's calls: F.linear, then its pass in place
      // (the bias in F.linear as eager adds it, or in the pass where the key says so: one token)
      const bool in_linear = entry->bias_in_linear;
      const at::Tensor& pass_bias = in_linear ? none : b;
      if (in_linear && bt && !entry->pass->on_device(*bt)) return py::none();  // (that route names it)
      if (!entry->pass->accepts(pass_bias, r)) return py::none();  // (that route names or serves it)
      // F.linear's call prepared where the key holds it (eager's kernel and bits, without the descriptors and
      // heuristic F.linear makes on every call: host time before the GEMM's launch, which a single call waits
      // out), or the bare GEMM's where the pass adds the bias (at::linear's bits); undefined where this call must
      // go at::linear's way
      at::Tensor y = entry->linear ? prepared_linear(*entry->linear, xt, wt, in_linear ? b : none, none) : at::Tensor();
      if (!y.defined()) y = in_linear ? at::linear(xt, wt, bt) : at::linear(xt, wt);
      (*entry->pass)(y, pass_bias, r, [&](at::Tensor& out) {  // (its fallback's calls, for an output less aligned)
        if (bt && !in_linear) out.add_(*bt);
        out = finish(std::move(out), act, rt);
      });
      return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(y)));
    }
    at::Tensor y;
    if (entry && entry->linear) {
      PreparedLinear& prepared = *entry->linear;
      y = prepared_linear(prepared, xt, wt, b, r);
      if (prepared.route() == Route::kLtCall) {  // (the Python route's cuBLASLt call, nothing follows; or that
        if (!y.defined()) return py::none();      // route's own plan serves the call: its arithmetic)
        return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(y)));
      }
    }
    if (!y.defined()) y = at::linear(xt, wt, bt);
    return py::reinterpret_steal<py::object>(THPVariable_Wrap(finish(std::move(y), act, rt)));
  }

  // Files the call's key (emptying the memo when it is full); false where the memo cannot serve such a call.
  // `lt_call`: the Python route served it with its cuBLASLt plan (a layer without an activation: the residual read
  // as C, the bias in cuBLASLt's epilogue), through the heuristic's algorithm of `lt_rank` (0: its first; another
  // where the layer's tune timed it faster): the key holds that call prepared, or is not filed; a call the
  // prepared one declines gets None (the Python route's plan serves it). `pass_launch`: the Python route served
  // it with F.linear and its pass (EpiloguePassInPlace.native_launch), which the key holds, or is not filed;
  // `bias_in_linear`: that route hands the bias to F.linear (EpiloguePassInPlace.bias_in_linear), and its pass
  // adds none: the key holds F.linear's call prepared too where the call suits (else at::linear makes it).
  // Otherwise the key holds F.linear's call prepared where it has a bias and the call suits (else at::linear
  // serves), and eager's calls follow it.
  // `kernel_launch`: the Python route served it with the generated kernel a tune kept
  // (TorchFusedEpiloguePlan.native_launch), which the key holds, or is not filed.
  bool file(py::handle x, py::handle weight, py::handle bias, py::handle activation, py::handle residual,
            bool lt_call, py::handle pass_launch, bool bias_in_linear, py::handle kernel_launch, int64_t lt_rank) {
    Words words;
    Activation act;
    if (!key_of(words, x.ptr(), weight.ptr(), bias.ptr(), activation.ptr(), residual.ptr(), act)) return false;
    if (!kernel_launch.is_none()) {  // (the kernel's arithmetic: nothing else stands in)
      if (!prepare_) return false;
      if (find(words)) return true;
      std::string why;
      auto kernel = PreparedKernel::prepare(kernel_launch, why);
      {
        std::lock_guard<std::mutex> hold(mutex_);
        last_unprepared_ = why;
      }
      if (!kernel) return false;
      insert(std::move(words), std::make_shared<Prepared>(Prepared{nullptr, nullptr, false, std::move(kernel)}));
      return true;
    }
    const bool as_lt = lt_call && act == kNone && (!residual.is_none() || !bias.is_none());
    const bool with_pass = !as_lt && !pass_launch.is_none();
    // (those routes' arithmetic is cuBLASLt's call, or the pass: nothing else stands in)
    if ((as_lt || with_pass) && !prepare_) return false;
    if (find(words)) return true;  // (filed already: a call it declined, served by the Python route)
    Entry entry;
    if (with_pass || (prepare_ && (as_lt || !bias.is_none()))) {
      std::string why;
      const at::Tensor none;
      const at::Tensor& xt = THPVariable_Unpack(x.ptr());
      const at::Tensor& wt = THPVariable_Unpack(weight.ptr());
      if (with_pass) {
        auto pass = PreparedPass::prepare(pass_launch, why);
        std::unique_ptr<PreparedLinear> linear;  // (a key without it still serves: at::linear then)
        if (pass && bias_in_linear && !bias.is_none()) {
          linear = PreparedLinear::prepare(Route::kLinear, xt, wt, THPVariable_Unpack(bias.ptr()), none, false,
                                           linear_workspace_bytes_, why);
        } else if (pass) {  // (the bias, if any, in the pass: the bare GEMM, where its bits are at::linear's with
                            // F.linear's cuBLASLt workspace or with the larger one of autogemm's plans)
          linear = PreparedLinear::prepare_bare(xt, wt, {linear_workspace_bytes_, lt_workspace_bytes_}, why);
        }
        if (pass) entry = std::make_shared<Prepared>(Prepared{std::move(linear), std::move(pass), bias_in_linear, nullptr});
      } else {
        auto linear = PreparedLinear::prepare(
            as_lt ? Route::kLtCall : Route::kLinear, xt, wt, bias.is_none() ? none : THPVariable_Unpack(bias.ptr()),
            residual.is_none() ? none : THPVariable_Unpack(residual.ptr()), act == kNone && residual.is_none(),
            as_lt ? lt_workspace_bytes_ : linear_workspace_bytes_, why, false, as_lt ? lt_rank : 0);
        if (linear) entry = std::make_shared<Prepared>(Prepared{std::move(linear), nullptr, false, nullptr});
      }
      std::lock_guard<std::mutex> hold(mutex_);
      last_unprepared_ = entry && entry->linear ? "" : why;
    }
    if ((as_lt || with_pass) && !entry) return false;
    insert(std::move(words), std::move(entry));
    return true;
  }

  // How many keys hold a prepared cuBLASLt call, how many the Python route's pass, how many a tuned kernel, and
  // why the last key that could have got one got none ("" where it did): what tests and benchmarks read
  size_t prepared() { return count([](const Prepared& p) { return p.linear != nullptr; }); }
  size_t passes() { return count([](const Prepared& p) { return p.pass != nullptr; }); }
  size_t kernels() { return count([](const Prepared& p) { return p.kernel != nullptr; }); }

  std::string unprepared_why() {
    std::lock_guard<std::mutex> hold(mutex_);
    return last_unprepared_;
  }

  void clear() {
    std::lock_guard<std::mutex> hold(mutex_);
    keys_.clear();
  }

  size_t size() {
    std::lock_guard<std::mutex> hold(mutex_);
    return keys_.size();
  }

 private:
  // What a key holds prepared: a cuBLASLt call, or the Python route's pass (behind F.linear's call, prepared
  // where F.linear adds the bias and the call suits), or a tuned kernel's launch
  struct Prepared {
    std::unique_ptr<PreparedLinear> linear;
    std::unique_ptr<PreparedPass> pass;
    bool bias_in_linear;  // (with `pass`: F.linear adds the bias, the pass the rest)
    std::unique_ptr<PreparedKernel> kernel;
  };
  // A key's entry: null where at::linear and eager's calls serve it (shared: a call holds it while another
  // files or clears)
  using Entry = std::shared_ptr<Prepared>;

  template <typename Holds>
  size_t count(Holds holds) {
    std::lock_guard<std::mutex> hold(mutex_);
    size_t n = 0;
    for (const auto& key_entry : keys_) n += key_entry.second && holds(*key_entry.second) ? 1 : 0;
    return n;
  }

  // Under a CUDA graph capture a prepared call steps aside for at::linear, which takes this thread's cuBLAS
  // handle of PyTorch's, creating it where the thread has none; and cublasCreate fails inside a capture, which
  // loses the capture. A thread whose every call so far the prepared call served (its own cuBLASLt handle) has
  // none: a layer warmed up through the memo, then captured, failed so (the GPU tier, session 73: a worker
  // whose earlier tests ran no PyTorch GEMM). So the first call on each thread outside a capture has PyTorch
  // make the handle (torch.cuda.current_blas_handle, the GIL held as every memo call holds it); after that a
  // thread-local flag, read per call, is all it costs.
  static void make_torch_blas_handle(const PreparedLinear& prepared) {
    thread_local bool made = false;
    if (made || prepared.capturing()) return;
    made = true;  // (once: where PyTorch cannot make it, at::linear meets what it met before)
    try {
      py::module_::import("torch.cuda").attr("current_blas_handle")();
    } catch (const py::error_already_set&) {
    }
  }

  // The prepared call's D (x @ w^T + b, and r as C for kLtCall), or undefined where the call must go another
  // way (at::linear's, or the Python route's plan)
  static at::Tensor prepared_linear(PreparedLinear& prepared, const at::Tensor& x, const at::Tensor& w,
                                    const at::Tensor& b, const at::Tensor& r) {
    if (prepared.route() == Route::kLinear) make_torch_blas_handle(prepared);
    try {
      return prepared(x, w, b, r);
    } catch (const std::exception&) {  // (an allocation that failed: the other way meets it too)
      return at::Tensor();
    }
  }

  // eager's calls after F.linear's: the activation and the residual in place
  static at::Tensor finish(at::Tensor y, Activation act, const at::Tensor* residual) {
    switch (act) {
      case kRelu: at::relu_(y); break;
      case kGelu: at::gelu_(y); break;
      case kGeluTanh: at::gelu_(y, "tanh"); break;
      case kSilu: at::silu_(y); break;
      default: break;
    }
    if (residual != nullptr) y.add_(*residual);
    return y;
  }

  // Whether the memo holds the key; its entry in `entry` (a copy: filing or clearing may replace it meanwhile)
  bool find(const Words& words, Entry* entry = nullptr) {
    std::lock_guard<std::mutex> hold(mutex_);
    auto found = keys_.find(words);
    if (found == keys_.end()) return false;
    if (entry != nullptr) *entry = found->second;
    return true;
  }

  void insert(Words&& words, Entry&& entry) {
    std::lock_guard<std::mutex> hold(mutex_);
    if (keys_.size() >= max_entries_) keys_.clear();
    keys_[std::move(words)] = std::move(entry);
  }

  size_t max_entries_;
  size_t linear_workspace_bytes_;
  size_t lt_workspace_bytes_;
  bool prepare_;
  std::mutex mutex_;
  std::unordered_map<Words, Entry, WordsHash, WordsEqual> keys_;
  std::string last_unprepared_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "autogemm.linear's memo of layers that eager's ATen calls serve (serving/native_linear.py)";
  py::class_<Memo>(m, "Memo")
      .def(py::init<size_t, size_t, size_t, bool>(), py::arg("max_entries"), py::arg("linear_workspace_bytes"),
           py::arg("lt_workspace_bytes"), py::arg("prepare"))  // (native_linear.new_memo gives them)
      .def("linear", &Memo::linear, "the route's result where the call's key is filed, else None")
      .def("file", &Memo::file, "files the call's key; False where the memo cannot serve it", py::arg("x"),
           py::arg("weight"), py::arg("bias"), py::arg("activation"), py::arg("residual"),
           py::arg("lt_call") = false, py::arg("pass_launch") = py::none(),
           py::arg("bias_in_linear") = false, py::arg("kernel_launch") = py::none(), py::arg("lt_rank") = 0)
      .def("matmul", &Memo::matmul, "torch.matmul(a, b) where the call's key is filed, else None")
      .def("file_matmul", &Memo::file_matmul, "files a matmul call's key; False where the memo cannot serve it")
      .def("prepared", &Memo::prepared, "how many keys hold a prepared cuBLASLt call")
      .def("passes", &Memo::passes, "how many keys hold the Python route's pass")
      .def("kernels", &Memo::kernels, "how many keys hold a tuned kernel's launch")
      .def("unprepared_why", &Memo::unprepared_why, "why the last key that could got no prepared call")
      .def("clear", &Memo::clear)
      .def("__len__", &Memo::size);
  m.def("kernel_arguments", &kernel_arguments, "a tuned kernel's launch with a call's arguments written as the "
        "memo writes them (x, weight, output, bias, residual addresses): the bytes, or None where it would decline");
}

// A simulated `npu` device for CONTRACT tests: PrivateUse1 over host memory (no Ascend hardware).
//
// What a backend registered in C++ gives torch, kept to what the user's path needs:
// - two devices, npu:0 and npu:1, as on a 2-card host: an allocator whose memory is host memory, labelled with
//   the device it was allocated for (the creation op's device, else the current device); an index the host
//   does not have is refused with torch_npu's error for it (aclrtSetDevice: 107001, invalid device ID);
// - tensor creation (empty.memory_format, empty_strided) and dtype views refusing float64 / complex128, which the
//   NPU does not take (diffusers' `_FP64_UNSUPPORTED_DEVICES` lists "npu");
// - views (as_strided, view, _reshape_alias, unfold) on the tensor's own storage, resize_, and
//   copies between npu and cpu;
// - every other op: a boxed fallback that first checks all tensor arguments are on one npu device (a CPU
//   tensor is taken only as a 0-dim scalar, as on CUDA; npu:0 with npu:1 is refused), then runs the CPU kernel
//   (at::native::cpu_fallback: inputs copied to the host, outputs copied back to npu);
// - a DeviceGuardImpl (two devices, a current one per thread, one stream each) and PrivateUse1 hooks, which
//   torch.compile and torch.accelerator ask for.
#include <torch/extension.h>

#include <ATen/EmptyTensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/unfold_native.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>

#include <atomic>
#include <cstring>

namespace {

constexpr c10::DeviceType kNpu = c10::DeviceType::PrivateUse1;
constexpr c10::DeviceIndex kDevices = 2;  // a 2-card host
std::atomic<int64_t> live_bytes[kDevices] = {0, 0};
std::atomic<int64_t> fallback_calls{0};
thread_local c10::DeviceIndex current = 0;  // as torch_npu's local_device: per thread, 0 until set

// What torch_npu raises for a device the host does not have: c10_npu::SetDevice -> aclrtSetDevice fails
// with ACL_ERROR_RT_INVALID_DEVICEID (107001), reported through NPU_CHECK_ERROR.
c10::DeviceIndex checked(c10::DeviceIndex index) {
  TORCH_CHECK(index >= 0, "device id must be positive!");
  TORCH_CHECK(index < kDevices, "NPU function error: c10_npu::SetDevice(device), error code is 107001\n",
              "[Error]: Invalid device ID.\n        Check whether the device ID is valid. (the simulated host has ",
              static_cast<int>(kDevices), " devices, npu:0 and npu:1; got npu:", static_cast<int>(index), ")");
  return index;
}

// The device a creation op allocates on: its device argument's index, else the current device.
c10::DeviceIndex target(std::optional<c10::Device> device) {
  return device.has_value() && device->has_index() ? checked(device->index()) : current;
}

// Makes `index` current for a scope (what a DeviceGuard does), so the allocator labels its memory.
struct CurrentDevice {
  c10::DeviceIndex saved;
  explicit CurrentDevice(c10::DeviceIndex index) : saved(current) { current = index; }
  ~CurrentDevice() { current = saved; }
};

struct Block {
  void* ptr;
  size_t size;
  c10::DeviceIndex device;
};

void free_block(void* ctx) {
  auto* b = static_cast<Block*>(ctx);
  live_bytes[b->device] -= static_cast<int64_t>(b->size);
  c10::free_cpu(b->ptr);
  delete b;
}

struct HostAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    void* p = n ? c10::alloc_cpu(n) : nullptr;
    live_bytes[current] += static_cast<int64_t>(n);
    return {p, new Block{p, n, current}, &free_block, c10::Device(kNpu, current)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  // copy_data: virtual from torch 2.3.
  void copy_data(void* dest, const void* src, std::size_t count) const { std::memcpy(dest, src, count); }
};

HostAllocator allocator;

void check_dtype(c10::ScalarType t) {
  TORCH_CHECK(t != c10::kDouble && t != c10::kComplexDouble, "the simulated npu device does not support ", t,
              " (Ascend NPUs have no float64 kernels; diffusers lists 'npu' in _FP64_UNSUPPORTED_DEVICES): use "
              "float32 or a lower precision");
}

constexpr c10::DispatchKeySet npu_keys() { return c10::DispatchKeySet(c10::DispatchKey::PrivateUse1); }

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  auto t = c10::dtype_or_default(dtype);
  check_dtype(t);
  CurrentDevice on(target(device));
  return at::detail::empty_generic(size, &allocator, npu_keys(), t, memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  auto t = c10::dtype_or_default(dtype);
  check_dtype(t);
  CurrentDevice on(target(device));
  return at::detail::empty_strided_generic(size, stride, &allocator, npu_keys(), t);
}

// A CPU tensor over the same host memory (no copy): what the copies below read and write.
at::Tensor host_view(const at::Tensor& t) {
  if (t.device().type() != kNpu) return t;
  if (t.numel() == 0) return at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kCPU));
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options().device(at::kCPU));
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(self.device().type() == kNpu || self.device().is_cpu(), "npu copy: unsupported source device ",
              self.device());
  TORCH_CHECK(dst.device().type() == kNpu || dst.device().is_cpu(), "npu copy: unsupported destination device ",
              dst.device());
  if (dst.numel() > 0) host_view(dst).copy_(host_view(self));
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  at::native::resize_(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  check_dtype(self.scalar_type());
  CurrentDevice on(self.device().index());  // a grown storage stays on the tensor's device
  return at::native::resize_(self, size, memory_format);
}

// A dtype-reinterpreting view allocates nothing: it is checked here, or float64 would slip in.
at::Tensor view_dtype(const at::Tensor& self, c10::ScalarType dtype) {
  check_dtype(dtype);
  return at::native::view_dtype(self, dtype);
}

c10::Scalar local_scalar_dense(const at::Tensor& self) { return at::_local_scalar_dense(host_view(self)); }

void check_devices(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const auto n = schema.arguments().size();
  std::optional<c10::Device> first;  // the npu device of the first npu tensor argument
  auto check = [&](const at::Tensor& t) {
    if (!t.defined() || (t.device().is_cpu() && t.dim() == 0)) return;
    if (!first.has_value() && t.device().type() == kNpu) first = t.device();
    TORCH_CHECK(t.device() == first.value_or(c10::Device(kNpu, current)),
                "Expected all tensors to be on the same device, but found at least two devices, ",
                first.value_or(c10::Device(kNpu, current)), " and ", t.device(), "! (", schema.name(),
                " on the simulated npu device)");
  };
  for (size_t i = stack->size() - n; i < stack->size(); ++i) {
    const auto& v = (*stack)[i];
    if (v.isTensor()) {
      check(v.toTensor());
    } else if (v.isTensorList()) {
      for (const auto& t : v.toTensorVector()) check(t);
    } else if (v.isOptionalTensorList()) {
      for (const std::optional<at::Tensor> t : v.toOptionalTensorList()) {
        if (t.has_value()) check(*t);
      }
    } else if (v.isGenerator()) {
      const auto& g = v.toGenerator();
      TORCH_CHECK(g.device().type() == kNpu, "Expected a 'npu' device type for generator but found '",
                  g.device().type(), "' (", schema.name(), " on the simulated npu device)");
    }
  }
}

// aten::convolution sends backends other than CPU/CUDA/... to convolution_overrideable, whose
// default kernel raises: run the CPU convolution on the same memory.
at::Tensor convolution_overrideable(const at::Tensor& input, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                                    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                                    c10::IntArrayRef output_padding, int64_t groups) {
  for (const at::Tensor* t : {&input, &weight, bias.has_value() ? &*bias : nullptr}) {
    TORCH_CHECK(t == nullptr || !t->defined() || t->device() == input.device(),
                "Expected all tensors to be on the same device, but found at least two devices, ", input.device(),
                " and ", t->device(), "! (aten::convolution on the simulated npu device)");
  }
  std::optional<at::Tensor> host_bias;
  if (bias.has_value() && bias->defined()) host_bias = host_view(*bias);
  return at::convolution(host_view(input), host_view(weight), host_bias, stride, padding, dilation, transposed,
                         output_padding, groups)
      .to(input.device());
}

void npu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  check_devices(op, stack);
  fallback_calls++;
  at::native::cpu_fallback(op, stack, /*error_on_views=*/true);
}

c10::Stream stream_of(c10::DeviceIndex index) {
  return c10::Stream(c10::Stream::DEFAULT, c10::Device(kNpu, index < 0 ? current : index));
}

// Two devices, a current one per thread, one stream each: what torch.accelerator, DeviceGuard and
// torch.compile ask for.
struct GuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kNpu; }
  c10::Device exchangeDevice(c10::Device d) const override {
    const c10::Device old(kNpu, current);
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kNpu, current); }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kNpu, "the simulated npu device guard got a ", d, " device");
    if (d.has_index()) current = checked(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.has_index() && d.index() >= 0 && d.index() < kDevices) current = d.index();
  }
  c10::Stream getStream(c10::Device d) const noexcept override { return stream_of(d.index()); }
  c10::Stream getDefaultStream(c10::Device d) const override { return stream_of(d.index()); }
  c10::Stream getNewStream(c10::Device d, int priority = 0) const override { return stream_of(d.index()); }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override { return stream_of(s.device_index()); }
  c10::DeviceIndex deviceCount() const noexcept override { return kDevices; }
  void destroyEvent(void* event, const c10::DeviceIndex device_index) const noexcept override {}
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {}
  void block(void* event, const c10::Stream& stream) const override {}
  bool queryEvent(void* event) const override { return true; }
  bool queryStream(const c10::Stream& stream) const override { return true; }
  void synchronizeStream(const c10::Stream& stream) const override {}
  void synchronizeEvent(void* event) const override {}
  void synchronizeDevice(const c10::DeviceIndex device_index) const {}  // virtual from torch 2.3
};

// The device a storage lives on (its DataPtr's label).
c10::DeviceIndex fresh_device(const c10::Storage& storage) {
  const auto index = storage.device().index();
  return index < 0 ? current : index;
}

struct Hooks final : at::PrivateUse1HooksInterface {
  // isBuilt / isAvailable / resizePrivateUse1Bytes: virtual in recent releases only (no `override`).
  bool isBuilt() const { return true; }
  bool isAvailable() const { return true; }
  bool hasPrimaryContext(c10::DeviceIndex device_index) const override { return true; }
  at::Device getDeviceFromPtr(void* data) const override { return c10::Device(kNpu, current); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const {
    // resize_ on this device's storages goes through at::native::resize_, which reallocates with
    // the storage's own allocator; torch asks the hooks only for storage-level resizes.
    auto* impl = storage.unsafeGetStorageImpl();
    CurrentDevice on(fresh_device(storage));
    auto fresh = allocator.allocate(newsize);
    const size_t keep = std::min(newsize, impl->nbytes());
    if (keep) std::memcpy(fresh.get(), impl->data(), keep);
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(newsize);
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

struct Registrar {
  Registrar() {
    c10::SetAllocator(kNpu, &allocator);
    at::RegisterPrivateUse1HooksInterface(new Hooks());
  }
} registrar;

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", at::native::as_strided_tensorimpl);
  m.impl("view", at::native::view);
  m.impl("view.dtype", view_dtype);
  m.impl("_reshape_alias", at::native::_reshape_alias);
  m.impl("unfold", at::native::unfold);
  m.impl("resize_", resize_);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("convolution_overrideable", convolution_overrideable);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&npu_fallback>()); }

// The fallback's calls and each device's live bytes: what a test reads to prove ops ran on the device.
int64_t fallback_count() { return fallback_calls.load(); }
int64_t memory_allocated(int64_t index) { return live_bytes[checked(static_cast<c10::DeviceIndex>(index))].load(); }
int64_t current_device() { return current; }
void set_device(int64_t index) { current = checked(static_cast<c10::DeviceIndex>(index)); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("fallback_count", &fallback_count);
  m.def("memory_allocated", &memory_allocated);
  m.def("current_device", &current_device);
  m.def("set_device", &set_device);
  m.def("device_count", [] { return static_cast<int64_t>(kDevices); });
}

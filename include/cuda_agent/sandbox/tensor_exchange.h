// Moving input and output trees between the judge and the candidate process through shared
// blocks: the tree's shape travels as JSON (a "spec"), the tensors' bytes in the block.
//
// A spec node is one of
//   {"t": "tensor", "offset": N, "shape": [...], "dtype": "float32"}   contiguous bytes at N
//   {"t": "tuple" | "list", "items": [...]}     {"t": "dict", "items": {"key": node, ...}}
//   {"t": "value", "value": null | bool | int | string}   {"t": "float", "value": "repr"}
// Offsets are 256-byte aligned. Each staged input tensor is followed by kPadBytes of poison
// (NaN, or the dtype's largest value), so a kernel that reads past an input's end reads poison.
//
// Specs from the other process are untrusted: build_tree() checks every offset, size, dtype
// and the tree's depth and size, and throws Error naming what is wrong. Call with the GIL held.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <pybind11/pybind11.h>

namespace cuda_agent::sandbox {

constexpr size_t kPadBytes = 4096;
constexpr size_t kTensorAlign = 256;

// Bytes a block needs to hold `tree`'s tensors staged (aligned, with the padding when `padded`).
size_t staged_bytes(pybind11::handle tree, bool padded);

// Copies `tree`'s tensors into `block` (a torch.uint8 tensor of the same device), padded, each
// in the layout a copy of it has (preserve_format: a transposed or channels-last tensor keeps its
// strides, one with gaps is made dense), and returns the spec. Throws Error for a leaf that is
// neither a tensor nor a plain value, or when the block is too small (size it with staged_bytes
// first).
nlohmann::json stage_tree(pybind11::handle tree, pybind11::handle block);

// One tensor's bytes for the judge's bracket to copy into the input block (judge_bracket.h): from
// `source` (device memory of the judge's own) to `offset` in the block.
struct InputCopy {
  uint64_t source = 0;
  size_t offset = 0;
  size_t bytes = 0;
};

// stage_tree's spec and padding, but the tensors' bytes are left for the caller to copy in later
// (the judge's bracket, once the candidate's run is queued): *copies gets one InputCopy a tensor.
// A tensor whose bytes already lie as stage_tree would write them (on the block's device, in the
// staged layout, unflagged) is copied from where it lies; any other is first copied into that
// layout in memory of its own, which *held keeps (until the copies ran). The block then holds
// what stage_tree would have written once the copies ran.
nlohmann::json stage_tree_deferred(pybind11::handle tree, pybind11::handle block, std::vector<InputCopy>* copies,
                                   std::vector<pybind11::object>* held);
// The bytes stage_tree_deferred would copy into memory of its own for `tree`, staged for a block
// on `device_type` ("cuda", "cpu"): 0 for a tree whose tensors lie as staged (the usual inputs).
size_t deferred_staging_bytes(pybind11::handle tree, const std::string& device_type);

// The tree a spec describes, its tensors as views into `block` (no copy). Throws Error for a
// spec that does not fit the block or is not a spec.
pybind11::object build_tree(const nlohmann::json& spec, pybind11::handle block);

// A tensor's clone, and whether an object is a torch.Tensor, through torch's C-level methods and
// type (clone_tree()'s, which runs in a candidate process after the solution loaded).
pybind11::object clone_tensor(pybind11::handle tensor);
bool is_torch_tensor(pybind11::handle obj);

// The path of the first staged tensor whose bytes in `block` differ from `tree`'s (NaN equal
// NaN), or "" when the candidate left its inputs as they were given.
std::string changed_tensor(pybind11::handle tree, const nlohmann::json& spec, pybind11::handle block);

// The candidate's side: reads an output tree through torch's C-level tensor methods (captured
// by capture_tensor_methods() before any solution code ran, so patched Python methods are never
// called) and copies each tensor's bytes into `block` at 256-byte-aligned offsets. Returns the
// spec, or throws OutputError naming the first output that is not a plain tensor with storage
// on the block's device, or that does not fit. *input_view (when given) gets the path of the
// first output whose data lies in [input_address, + input_bytes), the block the forward's inputs
// were built on: a view of an input (a transpose of it, say) was not computed, and the forward's
// time does not include the work its materialised copy takes. The judge rejects it
// (invalid_output) after its own check of the inputs. With `pending` (the bracket's export,
// queued before the judge lets the GPU go) nothing waits on the host: the copies go to the legacy
// stream, which waits for the streams a densified copy ran on, and the dense copies are handed to
// *pending, to be kept until the caller synchronized.
struct OutputError {
  std::string category;  // "invalid_output" or "mismatch"
  std::string message;
};
void capture_tensor_methods();
// Whether the solution intercepts the torch calls the harness makes after a forward (densifying an
// output, building the next inputs, poisoning memory), which would run its Python there, untimed
// and inside the harness's launch scope: a TorchFunctionMode or TorchDispatchMode left active, or
// a kernel of its own registered (torch.library) for one of the operators the harness uses. ""
// when nothing does; else what. After capture_tensor_methods().
std::string torch_interception();
// Whether something of the solution's would run its Python inside the harness's own Python-level
// work on this thread, no thread of its own needed (checked first by torch_interception()): a
// trace or profile function, a sys.monitoring tool, a Python signal handler, each compared with
// what was there before the solution loaded; "" when none. Such a function is handed the
// harness's frames (the integrity checks' list of problems, say, to empty).
std::string python_hooks();
nlohmann::json export_tree(pybind11::handle outputs, pybind11::handle block, uint64_t block_address, size_t block_bytes,
                           bool device, uint64_t input_address = 0, size_t input_bytes = 0,
                           std::string* input_view = nullptr, std::vector<pybind11::object>* pending = nullptr);

// After export_tree(), the candidate's side: each output compared bit for bit with its export in
// `output_block` (`spec`, what export_tree returned). `changed`: the path of the first output that
// differs already (written after the forward returned, by work the timer did not see end), and
// nothing more is checked. Else `reads_inputs`: the path of the first output whose bytes follow
// the forward's inputs although its data lies outside their block, the inputs' memory mapped a
// second time (cuMemMap of the block's retained allocation handle, mremap of the host block),
// which the address test above cannot see: every bit of `input_block` (a torch.uint8 tensor of
// the inputs' block) is flipped in place, the outputs compared again, and the bits flipped back
// before it returns, so that the judge's check of the inputs sees them as it wrote them. "" when
// none.
struct OutputsAfterExport {
  std::string changed;
  std::string reads_inputs;
};
OutputsAfterExport check_outputs_after_export(pybind11::handle outputs, const nlohmann::json& spec,
                                              pybind11::handle output_block, pybind11::handle input_block, bool device);

}  // namespace cuda_agent::sandbox

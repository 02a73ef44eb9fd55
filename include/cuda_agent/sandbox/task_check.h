// Judging a task from its reference's outputs (the robust-kbench / METR degenerate-task
// filters), and float64 copies of inputs for the strict precision policy. Call with the GIL held.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <pybind11/pybind11.h>

namespace cuda_agent::sandbox {

// Accumulates the reference's outputs over verify's trials and judges them against the tolerance in
// use: all outputs so close to zero that a zeros kernel passes, every output tensor so narrow that
// a constant kernel passes (one of a single element: over the trials), or outputs for different
// inputs all within the tolerance of the first trial's (input-independent: an output computed once,
// in __init__ say, passes every trial). Such a task cannot tell a real kernel from a trivial one. A
// reference whose output holds NaN for the task's own inputs (log of a normal draw, 0/0) is flagged
// too: NaN never matches, so no kernel, the reference itself included, passes it. So is a task with
// an output that is, within the tolerance, one of its inputs as it was given (a residual whose
// added term stays under atol, say): returning the input there (or a view of it with the output's
// shape) passes every trial without computing that output. And a task whose reference returns a
// view of one of its inputs (`x.t()`, `x[1:]`): the reference does no work there, and a solution
// cannot either (an output that is a view of an input is invalid), so it must copy and can only be
// slower.
// Hidden visibility, as pybind11 requires for types holding Python objects.
class __attribute__((visibility("hidden"))) TaskCheck {
 public:
  TaskCheck(double atol, double rtol) : atol_(atol), rtol_(rtol) {}
  // One trial's reference output (any tree of tensors) and the inputs it was computed from
  // (unchanged: the reference ran on a copy).
  void add(pybind11::handle ref_out, pybind11::handle inputs = pybind11::none());
  // The reference returned a view of an input (view_of_input's answer for one trial; "" is none).
  void note_view_of_input(const std::string& path) {
    if (view_of_input_.empty()) view_of_input_ = path;
  }
  // {trials_checked, max_abs_output, near_zero, near_constant, input_independent, nan_output,
  //  returns_input, views_input (with view_of_input: the output's path), degenerate}
  nlohmann::json to_json() const;

 private:
  double atol_, rtol_;
  int trials_ = 0;
  double max_abs_ = 0;
  bool any_varying_ = false;
  bool any_nan_ = false;
  bool any_inf_ = false;
  bool compared_ = false;
  bool all_close_to_first_ = true;
  std::vector<pybind11::object> first_;
  // The range over the trials of each output leaf of one element (by its place among the leaves).
  struct SingleRange {
    double lo = 0, hi = 0;
    int trials = 0;
  };
  std::map<size_t, SingleRange> single_ranges_;
  // Whether a constant at the midpoint of [lo, hi] is within the tolerance of both ends.
  bool narrow(double lo, double hi) const;
  // For each output leaf, which input leaves (same element count) it has been within the
  // tolerance of in every trial so far; empty until the first trial with inputs (which has an
  // output leaf: add returns before otherwise).
  std::vector<std::vector<bool>> matches_input_;
  std::string view_of_input_;
  void match_inputs(const std::vector<pybind11::object>& leaves, pybind11::handle inputs);
};

// Floating tensors of a tree (lists and tuples followed) converted to float64, complex ones to
// complex128; other values pass through.
pybind11::object to_float64(pybind11::handle obj);

// How floating_leaves gives a complex tensor: as two leaves, its real and its imaginary parts
// (a constant is constant in each part), or as one, the pairs of view_as_real (an output equals an
// input only in both parts at once).
enum class ComplexLeaves { kParts, kPairs };

// The floating tensors of an output tree, in order, complex ones as `complex` says; with
// `integers`, integer and bool tensors as well (bool as uint8), and Python numbers as 0-d tensors.
void floating_leaves(pybind11::handle obj, std::vector<pybind11::object>& out,
                     ComplexLeaves complex = ComplexLeaves::kParts, bool integers = false);

// The path ("output", "output[1]", ...) of the first tensor of `outputs` whose storage is the
// storage of a tensor of `inputs` (a view of it, or the input itself); "" when none is. Call it
// with the very input objects the outputs were computed from.
std::string view_of_input(pybind11::handle outputs, pybind11::handle inputs);

}  // namespace cuda_agent::sandbox

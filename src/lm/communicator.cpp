#include "communicator.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef CA_WITH_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "cuda_agent/core/error.h"
#include "torch_language_model.h"  // translate_errors

namespace cuda_agent::lm {
namespace {

std::chrono::milliseconds timeout_of(const lm::DistributedOptions& o) {
  return std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
}

c10::intrusive_ptr<c10d::Store> join_rendezvous(const lm::DistributedOptions& o) {
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(o.master_port);
  so.isServer = o.rank == 0;
  so.numWorkers = static_cast<size_t>(o.world_size);
  so.waitWorkers = true;
  so.timeout = timeout_of(o);
  return translate_errors(fmt::format("rank {} of {} could not join the rendezvous at {}:{} (MASTER_ADDR, MASTER_PORT; rank 0 "
                             "hosts it and every rank must reach it within {} s)",
                             o.rank, o.world_size, o.master_addr, o.master_port, o.timeout_s).c_str(),
                 [&] { return c10::intrusive_ptr<c10d::Store>(c10::make_intrusive<c10d::TCPStore>(o.master_addr, so)); });
}

// Holds the job's store. Rank 0 hosts it, so rank 0 waits on destruction until every rank has
// said it is done with it (up to the timeout): a rank that finished first must not take the
// store away from one still reading the last collective's messages.
class StoreHandle {
 public:
  explicit StoreHandle(const lm::DistributedOptions& o) : options_(o), store_(join_rendezvous(o)) {}
  ~StoreHandle() {
    try {
      store_->add("ca/done", 1);
      if (options_.rank != 0) return;
      const auto deadline = std::chrono::steady_clock::now() + timeout_of(options_);
      while (store_->add("ca/done", 0) < options_.world_size && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    } catch (const std::exception&) {
      // Another rank is gone already: nothing left to wait for.
    }
  }
  c10d::Store& operator*() const { return *store_; }
  c10d::Store* operator->() const { return store_.get(); }
  const c10::intrusive_ptr<c10d::Store>& get() const { return store_; }

 private:
  lm::DistributedOptions options_;
  c10::intrusive_ptr<c10d::Store> store_;
};

// A world of one: nothing to exchange.
class SingleProcess final : public Communicator {
 public:
  SingleProcess(const lm::DistributedOptions& o, const at::Device& device) : Communicator(o, device) {}
  std::string backend() const override { return "none"; }
  void all_reduce_sum(const std::vector<at::Tensor>&) override {}
  void broadcast(const std::vector<at::Tensor>&, int) override {}
};

// The CPU backend: every rank posts its tensors' bytes under its own key of the call and reads
// everyone's; the sums run in rank order on every rank, so every rank gets the same bits.
class StoreCommunicator final : public Communicator {
 public:
  StoreCommunicator(const lm::DistributedOptions& o, const at::Device& device) : Communicator(o, device), store_(o) {}
  std::string backend() const override { return "store"; }

  void all_reduce_sum(const std::vector<at::Tensor>& tensors) override {
    const std::vector<std::vector<uint8_t>> all = exchange(pack(tensors), /*from=*/-1);
    size_t offset = 0;
    for (const at::Tensor& t : tensors) {
      const size_t bytes = t.nbytes();
      at::Tensor sum = at::zeros_like(t, t.options().device(at::kCPU));
      for (const auto& message : all) {
        CA_CHECK(message.size() >= offset + bytes, "all_reduce_sum: ranks passed tensors of different sizes");
        sum.add_(at::from_blob(const_cast<uint8_t*>(message.data()) + offset, t.sizes(), t.options().device(at::kCPU)));
      }
      t.copy_(sum);
      offset += bytes;
    }
  }

  void broadcast(const std::vector<at::Tensor>& tensors, int root) override {
    CA_CHECK(root >= 0 && root < world_size(), "broadcast: root {} is not a rank of a world of {}", root, world_size());
    const std::vector<std::vector<uint8_t>> all =
        exchange(rank() == root ? pack(tensors) : std::vector<uint8_t>{}, root);
    size_t offset = 0;
    for (const at::Tensor& t : tensors) {
      const size_t bytes = t.nbytes();
      CA_CHECK(all[root].size() >= offset + bytes, "broadcast: rank {} passed tensors of other sizes", root);
      if (rank() != root)
        t.copy_(at::from_blob(const_cast<uint8_t*>(all[root].data()) + offset, t.sizes(), t.options().device(at::kCPU)));
      offset += bytes;
    }
  }

 private:
  static std::vector<uint8_t> pack(const std::vector<at::Tensor>& tensors) {
    size_t total = 0;
    for (const at::Tensor& t : tensors) {
      CA_CHECK(t.is_contiguous(), "collective: tensors must be contiguous");
      total += t.nbytes();
    }
    std::vector<uint8_t> out(total);
    size_t offset = 0;
    for (const at::Tensor& t : tensors) {
      const at::Tensor c = t.to(at::kCPU).contiguous();
      std::memcpy(out.data() + offset, c.data_ptr(), c.nbytes());
      offset += c.nbytes();
    }
    return out;
  }

  std::string key(int64_t call, int rank) const { return fmt::format("ca/{}/{}", call, rank); }

  // Posts `mine` as this rank's message of the next call and waits for every rank's (all of
  // them: the wait is also what makes the cleanup below safe). from >= 0: only that rank's
  // message is read back (the others are empty markers).
  std::vector<std::vector<uint8_t>> exchange(const std::vector<uint8_t>& mine, int from) {
    const int64_t call = ++calls_;
    // Every rank posted call - 1 after finishing call - 2, and rank 0 saw all of call - 1: the
    // messages of call - 2 are read everywhere and can go.
    if (rank() == 0 && call > 2)
      for (int r = 0; r < world_size(); ++r) store_->deleteKey(key(call - 2, r));
    return translate_errors(fmt::format("rank {}: collective {} did not complete within {} s (did another rank fail?)", rank(),
                               call, options().timeout_s).c_str(),
                   [&] {
                     store_->set(key(call, rank()), mine);
                     std::vector<std::string> keys;
                     for (int r = 0; r < world_size(); ++r) keys.push_back(key(call, r));
                     store_->wait(keys);
                     std::vector<std::vector<uint8_t>> all(world_size());
                     for (int r = 0; r < world_size(); ++r)
                       if (from < 0 || r == from) all[r] = r == rank() ? mine : store_->get(key(call, r));
                     return all;
                   });
  }

  StoreHandle store_;
  int64_t calls_ = 0;
};

#ifdef CA_WITH_NCCL
// The CUDA backend: c10d's ProcessGroupNCCL. Tensors are summed in buckets of one dtype
// (flattened, at most kBucketElements each) to keep the number of collectives small.
class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const lm::DistributedOptions& o, const at::Device& device) : Communicator(o, device) {
    setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);  // NVLink multicast stays off (the hosts ask it)
    c10::cuda::set_device(device.index());
    store_ = std::make_unique<StoreHandle>(o);
    auto pg_options = c10d::ProcessGroupNCCL::Options::create();
    pg_options->timeout = timeout_of(o);
    pg_ = translate_errors(fmt::format("rank {}: could not create the NCCL process group", o.rank).c_str(), [&] {
      return c10::make_intrusive<c10d::ProcessGroupNCCL>(store_->get(), o.rank, o.world_size, pg_options);
    });
  }
  std::string backend() const override { return "nccl"; }

  void all_reduce_sum(const std::vector<at::Tensor>& tensors) override {
    std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;
    for (const at::Tensor& t : tensors) by_dtype[t.scalar_type()].push_back(t);
    for (auto& [dtype, group] : by_dtype) {
      size_t begin = 0;
      while (begin < group.size()) {
        size_t end = begin;
        int64_t elements = 0;
        while (end < group.size() && (end == begin || elements + group[end].numel() <= kBucketElements))
          elements += group[end++].numel();
        std::vector<at::Tensor> flat;
        for (size_t i = begin; i < end; ++i) flat.push_back(group[i].reshape({-1}));
        std::vector<at::Tensor> bucket = {at::cat(flat)};
        run("all_reduce", [&] { return pg_->allreduce(bucket); });
        int64_t offset = 0;
        for (size_t i = begin; i < end; ++i) {
          group[i].copy_(bucket[0].narrow(0, offset, group[i].numel()).view(group[i].sizes()));
          offset += group[i].numel();
        }
        begin = end;
      }
    }
  }

  void broadcast(const std::vector<at::Tensor>& tensors, int root) override {
    c10d::BroadcastOptions bo;
    bo.rootRank = root;
    for (const at::Tensor& t : tensors) {
      std::vector<at::Tensor> one = {t};
      run("broadcast", [&] { return pg_->broadcast(one, bo); });
    }
  }

 private:
  static constexpr int64_t kBucketElements = int64_t{1} << 27;

  template <typename F>
  void run(const char* what, F&& f) {
    translate_errors(fmt::format("rank {}: NCCL {} failed", rank(), what).c_str(), [&] {
      f()->wait();
      return 0;
    });
  }

  std::unique_ptr<StoreHandle> store_;  // declared first: destroyed after the process group
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> pg_;
};
#endif

}  // namespace

std::vector<double> Communicator::sum(const std::vector<double>& values) {
  if (world_size() == 1 || values.empty()) return values;
  at::Tensor t = at::tensor(at::ArrayRef<double>(values), at::TensorOptions().dtype(at::kDouble)).to(device_);
  all_reduce_sum({t});
  t = t.to(at::kCPU);
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
}

std::unique_ptr<Communicator> make_communicator(const lm::DistributedOptions& options, const at::Device& device) {
  if (!options.distributed()) return std::make_unique<SingleProcess>(options, device);
  if (device.is_cuda()) {
#ifdef CA_WITH_NCCL
    return std::make_unique<NcclCommunicator>(options, device);
#else
    CA_FAIL("WORLD_SIZE={} on {}: this build has no NCCL (nccl.h was not found when it was configured); install the "
            "NCCL headers (the nvidia-nccl Python package beside torch has them) and reconfigure",
            options.world_size, device.str());
#endif
  }
  return std::make_unique<StoreCommunicator>(options, device);
}

}  // namespace cuda_agent::lm

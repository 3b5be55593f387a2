// Dynamic batching TensorFlow ops for scalable_agent (IMPALA).
//
// Many actor threads each want to run the same network on one example. A
// Batcher resource collects those single-example calls, hands them to one
// "batched computation" thread as one concatenated batch, and splits the
// batched results back to the callers:
//
//   caller threads:  outputs = BatcherCompute(handle, inputs)     (async)
//   batching thread: inputs, id = BatcherGetInputs(handle)        (async)
//                    outputs = f(inputs)
//                    BatcherSetOutputs(handle, id, outputs)
//   shutdown:        BatcherClose(handle)
//
// Every blocking op is an AsyncOpKernel, so no TensorFlow inter-op thread is
// ever parked inside this file: with 64 waiting callers and a two-thread
// session pool the batching thread's own ops still get to run. Every waiting
// op also registers with its step's CancellationManager, so a session run
// with a timeout (or a closed session) ends instead of hanging. Callbacks
// (`done`) are never run while the batcher's mutex is held.
//
// Built by dynamic_batching.py with g++ -std=c++17 against the installed
// TensorFlow; there is no manual build step.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/platform/errors.h"
#include "tensorflow/core/platform/mutex.h"
#include "tensorflow/core/platform/thread_annotations.h"
#include "tensorflow/core/util/batch_util.h"

namespace scalable_agent {
namespace {

using ::tensorflow::AsyncOpKernel;
using ::tensorflow::CancellationManager;
using ::tensorflow::CancellationToken;
using ::tensorflow::DataType;
using ::tensorflow::DataTypeString;
using ::tensorflow::DataTypeVector;
using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpInputList;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::PartialTensorShape;
using ::tensorflow::ResourceBase;
using ::tensorflow::ResourceOpKernel;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::mutex;
using ::tensorflow::mutex_lock;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;
namespace errors = ::tensorflow::errors;

using Clock = std::chrono::steady_clock;

// Number of live BatcherCore objects in this process; read by the
// BatcherLiveCount op so tests can prove that create/close leaks nothing.
std::atomic<int64_t> live_cores{0};

// One waiting op: a BatcherCompute caller or a BatcherGetInputs call.
struct Request {
  int64_t id = 0;  // unique per core; names the request in cancel callbacks
  OpKernelContext* ctx = nullptr;
  AsyncOpKernel::DoneCallback done;
  CancellationManager* cm = nullptr;  // set once a cancel callback exists
  CancellationToken token = 0;

  // BatcherCompute only.
  std::vector<Tensor> inputs;
  Clock::time_point arrival;

  // BatcherGetInputs only: what the batched computation was built for.
  DataTypeVector dtypes;
  std::vector<PartialTensorShape> element_shapes;  // empty: unconstrained
  bool same_step_outputs = false;  // fail the batch if its step ends first
};
using RequestPtr = std::shared_ptr<Request>;

// Work that must run after the mutex is released (it calls `done`).
using Deferred = std::vector<std::function<void()>>;

void RunDeferred(Deferred* deferred) {
  for (auto& fn : *deferred) fn();
  deferred->clear();
}

// Completes a request that was removed from the core's queues. Must not be
// called with the core's mutex held (DeregisterCallback can block until a
// running cancel callback, which takes that mutex, has returned).
void Finish(const RequestPtr& r, const absl::Status& status) {
  if (r->cm != nullptr) r->cm->DeregisterCallback(r->token);
  if (!status.ok()) r->ctx->SetStatus(status);
  r->done();
}

std::string ShapeString(const Tensor& t) { return t.shape().DebugString(); }

// A batch handed out by BatcherGetInputs and not yet answered by
// BatcherSetOutputs. A caller cancelled meanwhile leaves a nullptr slot, so
// the batch size (and each caller's row) stays fixed.
struct Computation {
  std::vector<RequestPtr> callers;
};

// The batching state machine. Owned through shared_ptr by the Batcher
// resource, the timeout thread and cancel callbacks (weakly), so no thread
// ever touches freed state.
class BatcherCore : public std::enable_shared_from_this<BatcherCore> {
 public:
  BatcherCore(int64_t minimum_batch_size, int64_t maximum_batch_size,
              int64_t timeout_ms)
      : minimum_batch_size_(minimum_batch_size),
        maximum_batch_size_(maximum_batch_size),
        timeout_ms_(timeout_ms) {
    live_cores.fetch_add(1);
  }
  ~BatcherCore() { live_cores.fetch_sub(1); }

  BatcherCore(const BatcherCore&) = delete;
  BatcherCore& operator=(const BatcherCore&) = delete;

  int64_t minimum_batch_size() const { return minimum_batch_size_; }
  int64_t maximum_batch_size() const { return maximum_batch_size_; }
  int64_t timeout_ms() const { return timeout_ms_; }

  // A timeout only matters when a batch may wait for more inputs
  // (minimum > 1) and the wait is bounded (timeout >= 0).
  bool NeedsTimer() const {
    return minimum_batch_size_ > 1 && timeout_ms_ >= 0;
  }

  // BatcherCompute: queues one caller's inputs (each with leading dim 1).
  void Compute(OpKernelContext* ctx, AsyncOpKernel::DoneCallback done,
               std::vector<Tensor> inputs) {
    auto r = std::make_shared<Request>();
    r->ctx = ctx;
    r->done = std::move(done);
    r->inputs = std::move(inputs);
    r->arrival = Clock::now();
    absl::Status status;
    Deferred deferred;
    {
      mutex_lock l(mu_);
      r->id = next_request_id_++;
      if (closed_) {
        status = ClosedError("BatcherCompute");
      } else if (!pending_.empty()) {
        status = CheckSameSignature(*pending_.front(), *r);
      }
      if (status.ok() && !RegisterCancellation(r)) {
        status = errors::Cancelled("BatcherCompute was cancelled.");
      }
      if (status.ok()) {
        const bool was_empty = pending_.empty();
        pending_.push_back(r);
        FormBatches(&deferred);
        if (was_empty) WakeTimer();
      }
    }
    if (!status.ok()) {
      // Never registered (or registration refused), so just fail it.
      r->ctx->SetStatus(status);
      r->done();
    }
    RunDeferred(&deferred);
  }

  // BatcherGetInputs: waits for the next batch.
  void GetInputs(OpKernelContext* ctx, AsyncOpKernel::DoneCallback done,
                 DataTypeVector dtypes,
                 std::vector<PartialTensorShape> element_shapes,
                 bool same_step_outputs) {
    auto r = std::make_shared<Request>();
    r->ctx = ctx;
    r->done = std::move(done);
    r->dtypes = std::move(dtypes);
    r->element_shapes = std::move(element_shapes);
    r->same_step_outputs = same_step_outputs;
    absl::Status status;
    Deferred deferred;
    {
      mutex_lock l(mu_);
      r->id = next_request_id_++;
      if (closed_) {
        status = ClosedError("BatcherGetInputs");
      } else if (!RegisterCancellation(r)) {
        status = errors::Cancelled("BatcherGetInputs was cancelled.");
      } else {
        const bool was_empty = waiters_.empty();
        waiters_.push_back(r);
        FormBatches(&deferred);
        if (was_empty) WakeTimer();
      }
    }
    if (!status.ok()) {
      r->ctx->SetStatus(status);
      r->done();
    }
    RunDeferred(&deferred);
  }

  // BatcherSetOutputs: answers computation `id` with `outputs`, each of
  // leading dimension equal to that computation's batch size.
  absl::Status SetOutputs(int64_t id, const std::vector<Tensor>& outputs) {
    std::vector<RequestPtr> callers;
    {
      mutex_lock l(mu_);
      if (closed_) return ClosedError("BatcherSetOutputs");
      auto it = in_flight_.find(id);
      if (it == in_flight_.end()) {
        return errors::InvalidArgument(
            "BatcherSetOutputs: unknown computation_id ", id,
            ". Pass the computation_id that BatcherGetInputs returned, once.");
      }
      callers = std::move(it->second.callers);
      in_flight_.erase(it);
    }
    const int64_t batch_size = static_cast<int64_t>(callers.size());
    absl::Status status;
    for (size_t k = 0; k < outputs.size() && status.ok(); ++k) {
      const Tensor& t = outputs[k];
      if (t.dims() < 1 || t.dim_size(0) != batch_size) {
        status = errors::InvalidArgument(
            "BatcherSetOutputs: output ", k, " has shape ", ShapeString(t),
            " but computation ", id, " has batch size ", batch_size,
            "; every output of the batched function needs leading "
            "(batch) dimension ",
            batch_size, ".");
      }
    }
    if (!status.ok()) {
      for (const RequestPtr& c : callers) {
        if (c != nullptr) Finish(c, status);
      }
      return status;
    }
    for (int64_t j = 0; j < batch_size; ++j) {
      const RequestPtr& c = callers[j];
      if (c == nullptr) continue;  // cancelled while the batch was computed
      Finish(c, CopyRowToCaller(outputs, j, c->ctx));
    }
    return absl::OkStatus();
  }

  // BatcherClose (and resource destruction): fails everything pending with
  // Cancelled and makes every later call fail the same way.
  void Close() {
    std::vector<RequestPtr> to_cancel;
    {
      mutex_lock l(mu_);
      if (closed_) return;
      closed_ = true;
      for (auto& r : pending_) to_cancel.push_back(std::move(r));
      for (auto& r : waiters_) to_cancel.push_back(std::move(r));
      for (auto& entry : in_flight_) {
        for (auto& r : entry.second.callers) {
          if (r != nullptr) to_cancel.push_back(std::move(r));
        }
      }
      pending_.clear();
      waiters_.clear();
      in_flight_.clear();
      timer_cv_.notify_all();
    }
    for (const RequestPtr& r : to_cancel) Finish(r, ClosedError("Batcher"));
  }

  // {inputs waiting, BatcherGetInputs ops waiting, computations waiting for
  // BatcherSetOutputs}: for tests and debugging.
  std::vector<int64_t> Stats() {
    mutex_lock l(mu_);
    return {static_cast<int64_t>(pending_.size()),
            static_cast<int64_t>(waiters_.size()),
            static_cast<int64_t>(in_flight_.size())};
  }

  // Puts the callers of computation `id` (not yet delivered) back at the
  // front of the queue, oldest first.
  void Requeue(int64_t id) {
    Deferred deferred;
    {
      mutex_lock l(mu_);
      auto it = in_flight_.find(id);
      if (it == in_flight_.end()) return;
      std::vector<RequestPtr> callers = std::move(it->second.callers);
      in_flight_.erase(it);
      for (auto c = callers.rbegin(); c != callers.rend(); ++c) {
        if (*c != nullptr) pending_.push_front(std::move(*c));
      }
      FormBatches(&deferred);
      WakeTimer();
    }
    RunDeferred(&deferred);
  }

  // Fails the callers of computation `id` if it is still waiting for its
  // outputs: called when the step that ran BatcherGetInputs ends, so a
  // batched function that raised an error cannot leave its callers hanging.
  void Abandon(int64_t id) {
    std::vector<RequestPtr> callers;
    {
      mutex_lock l(mu_);
      auto it = in_flight_.find(id);
      if (it == in_flight_.end()) return;
      callers = std::move(it->second.callers);
      in_flight_.erase(it);
    }
    const absl::Status status = errors::Internal(
        "dynamic batching: the batched computation ", id,
        " ended without BatcherSetOutputs; the batched function most likely "
        "raised an error, which the batching thread logs.");
    for (const RequestPtr& c : callers) {
      if (c != nullptr) Finish(c, status);
    }
  }

  // Body of the timeout thread: forms a partial batch once the oldest
  // waiting input has waited timeout_ms. Returns after Close().
  void TimerLoop() {
    while (true) {
      Deferred deferred;
      {
        mutex_lock l(mu_);
        while (true) {
          if (closed_) return;
          const std::optional<Clock::time_point> deadline = TimeoutDeadline();
          if (!deadline.has_value()) {
            timer_cv_.wait(l);
            continue;
          }
          const Clock::time_point now = Clock::now();
          if (now >= *deadline) break;
          // Woken early (new front, new waiter, close) or spuriously: the
          // loop recomputes the deadline either way.
          timer_cv_.wait_for(l, *deadline - now);
        }
        FormBatches(&deferred);
      }
      RunDeferred(&deferred);
    }
  }

 private:
  static absl::Status ClosedError(const char* op) {
    return errors::Cancelled(op, ": the Batcher is closed.");
  }

  // Checks that `r` has the same inputs (count, dtypes, shapes) as `front`,
  // a caller already waiting in the same batch queue.
  static absl::Status CheckSameSignature(const Request& front,
                                         const Request& r) {
    if (front.inputs.size() != r.inputs.size()) {
      return errors::InvalidArgument(
          "BatcherCompute: got ", r.inputs.size(),
          " inputs but the callers already waiting passed ",
          front.inputs.size(),
          "; every caller must pass the same number of inputs.");
    }
    for (size_t i = 0; i < r.inputs.size(); ++i) {
      const Tensor& a = front.inputs[i];
      const Tensor& b = r.inputs[i];
      if (a.dtype() != b.dtype() || a.shape() != b.shape()) {
        return errors::InvalidArgument(
            "BatcherCompute: input ", i, " is ", DataTypeString(b.dtype()),
            " ", ShapeString(b), " but the callers already waiting passed ",
            DataTypeString(a.dtype()), " ", ShapeString(a),
            "; every caller must pass inputs of the same dtypes and shapes.");
      }
    }
    return absl::OkStatus();
  }

  // Checks a caller's inputs against what a BatcherGetInputs op declared.
  static absl::Status CheckAgainstWaiter(const Request& waiter,
                                         const Request& c) {
    if (c.inputs.size() != waiter.dtypes.size()) {
      return errors::InvalidArgument(
          "BatcherCompute: got ", c.inputs.size(),
          " inputs but the batched computation (BatcherGetInputs) takes ",
          waiter.dtypes.size(), ".");
    }
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      const Tensor& t = c.inputs[i];
      if (t.dtype() != waiter.dtypes[i]) {
        return errors::InvalidArgument(
            "BatcherCompute: input ", i, " has dtype ",
            DataTypeString(t.dtype()),
            " but the batched computation (BatcherGetInputs) takes ",
            DataTypeString(waiter.dtypes[i]), ".");
      }
      if (!waiter.element_shapes.empty()) {
        TensorShape element = t.shape();
        element.RemoveDim(0);
        if (!waiter.element_shapes[i].IsCompatibleWith(element)) {
          return errors::InvalidArgument(
              "BatcherCompute: input ", i, " has shape ", ShapeString(t),
              " but the batched computation (BatcherGetInputs) takes "
              "[batch] + ",
              waiter.element_shapes[i].DebugString(), ".");
        }
      }
    }
    return absl::OkStatus();
  }

  // Registers a cancel callback for `r` with its step's CancellationManager.
  // Called with mu_ held and before `r` is queued: the callback takes mu_,
  // so it cannot look for `r` before `r` is in a queue. Returns false if
  // the step is already cancelled.
  bool RegisterCancellation(const RequestPtr& r)
      TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    CancellationManager* cm = r->ctx->cancellation_manager();
    if (cm == nullptr) return true;
    const CancellationToken token = cm->get_cancellation_token();
    std::weak_ptr<BatcherCore> weak = weak_from_this();
    const int64_t id = r->id;
    const bool registered = cm->RegisterCallback(token, [weak, id]() {
      if (auto core = weak.lock()) core->CancelRequest(id);
    });
    if (!registered) return false;
    r->cm = cm;
    r->token = token;
    return true;
  }

  // Cancel callback: removes request `id` wherever it waits and fails it.
  // Runs inside CancellationManager::StartCancel, so it must not call
  // DeregisterCallback (that would wait for itself).
  void CancelRequest(int64_t id) {
    RequestPtr found;
    {
      mutex_lock l(mu_);
      found = RemoveFrom(&pending_, id);
      if (found == nullptr) found = RemoveFrom(&waiters_, id);
      if (found == nullptr) {
        for (auto& entry : in_flight_) {
          for (auto& c : entry.second.callers) {
            if (c != nullptr && c->id == id) {
              found = std::move(c);
              c = nullptr;
              break;
            }
          }
          if (found != nullptr) break;
        }
      }
    }
    if (found == nullptr) return;  // already completed
    found->ctx->SetStatus(
        errors::Cancelled("Batcher op cancelled: its session run was "
                          "cancelled, timed out or its session closed."));
    found->done();
  }

  static RequestPtr RemoveFrom(std::deque<RequestPtr>* queue, int64_t id) {
    for (auto it = queue->begin(); it != queue->end(); ++it) {
      if ((*it)->id == id) {
        RequestPtr r = std::move(*it);
        queue->erase(it);
        return r;
      }
    }
    return nullptr;
  }

  void WakeTimer() TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // The timer sleeps without a deadline only while one of the two queues
    // is empty, so it needs a signal only when one stops being empty; a
    // later front only moves its deadline later, which it rechecks itself.
    if (NeedsTimer() && !waiters_.empty() && !pending_.empty()) {
      timer_cv_.notify_one();
    }
  }

  // When the oldest waiting input times out, if a timeout applies and a
  // BatcherGetInputs op is waiting; nullopt otherwise.
  std::optional<Clock::time_point> TimeoutDeadline() const
      TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (timeout_ms_ < 0 || waiters_.empty() || pending_.empty()) {
      return std::nullopt;
    }
    return pending_.front()->arrival + std::chrono::milliseconds(timeout_ms_);
  }

  bool BatchReady() const TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (waiters_.empty() || pending_.empty()) return false;
    if (static_cast<int64_t>(pending_.size()) >= minimum_batch_size_) {
      return true;
    }
    const std::optional<Clock::time_point> deadline = TimeoutDeadline();
    return deadline.has_value() && Clock::now() >= *deadline;
  }

  // Forms as many batches as there are ready inputs and waiting
  // BatcherGetInputs ops; their completion goes into `deferred`.
  void FormBatches(Deferred* deferred) TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (BatchReady()) {
      RequestPtr waiter = std::move(waiters_.front());
      waiters_.pop_front();
      std::vector<RequestPtr> batch;
      while (!pending_.empty() &&
             static_cast<int64_t>(batch.size()) < maximum_batch_size_) {
        RequestPtr c = std::move(pending_.front());
        pending_.pop_front();
        absl::Status s = CheckAgainstWaiter(*waiter, *c);
        if (!s.ok()) {
          deferred->push_back([c, s]() { Finish(c, s); });
          continue;
        }
        batch.push_back(std::move(c));
      }
      if (batch.empty()) {  // every waiting input was unusable
        waiters_.push_front(std::move(waiter));
        continue;
      }
      const int64_t id = next_computation_id_++;
      in_flight_[id].callers = batch;
      std::weak_ptr<BatcherCore> weak = weak_from_this();
      deferred->push_back(
          [weak, waiter = std::move(waiter), batch = std::move(batch), id]() {
            DeliverBatch(weak, waiter, batch, id);
          });
    }
  }

  // Completes a BatcherGetInputs op with the concatenated inputs of `batch`
  // (computation `id`). Runs without mu_.
  static void DeliverBatch(const std::weak_ptr<BatcherCore>& weak,
                           const RequestPtr& waiter,
                           const std::vector<RequestPtr>& batch, int64_t id);

  // Copies row `row` of each output into a caller's outputs (leading dim 1).
  static absl::Status CopyRowToCaller(const std::vector<Tensor>& outputs,
                                      int64_t row, OpKernelContext* ctx) {
    if (ctx->num_outputs() != static_cast<int>(outputs.size())) {
      return errors::InvalidArgument(
          "BatcherSetOutputs: got ", outputs.size(),
          " outputs but BatcherCompute expects ", ctx->num_outputs(), ".");
    }
    for (size_t k = 0; k < outputs.size(); ++k) {
      const Tensor& src = outputs[k];
      if (src.dtype() != ctx->expected_output_dtype(k)) {
        return errors::InvalidArgument(
            "BatcherSetOutputs: output ", k, " has dtype ",
            DataTypeString(src.dtype()), " but BatcherCompute expects ",
            DataTypeString(ctx->expected_output_dtype(k)), ".");
      }
      TensorShape shape = src.shape();
      shape.set_dim(0, 1);
      Tensor* dst = nullptr;
      TF_RETURN_IF_ERROR(ctx->allocate_output(k, shape, &dst));
      TF_RETURN_IF_ERROR(
          tensorflow::batch_util::CopyContiguousSlices(src, row, 0, 1, dst));
    }
    return absl::OkStatus();
  }

  const int64_t minimum_batch_size_;
  const int64_t maximum_batch_size_;
  const int64_t timeout_ms_;

  mutex mu_;
  tensorflow::condition_variable timer_cv_;
  bool closed_ TF_GUARDED_BY(mu_) = false;
  int64_t next_request_id_ TF_GUARDED_BY(mu_) = 0;
  int64_t next_computation_id_ TF_GUARDED_BY(mu_) = 0;
  std::deque<RequestPtr> pending_ TF_GUARDED_BY(mu_);  // compute callers
  std::deque<RequestPtr> waiters_ TF_GUARDED_BY(mu_);  // GetInputs ops
  std::unordered_map<int64_t, Computation> in_flight_ TF_GUARDED_BY(mu_);
};

// With same_step_outputs, lives in the step container of the step that ran
// BatcherGetInputs; the step's end destroys it, and if that computation never
// got its outputs its callers are failed instead of waiting forever.
class ComputationGuard : public ResourceBase {
 public:
  ComputationGuard(std::weak_ptr<BatcherCore> core, int64_t id)
      : core_(std::move(core)), id_(id) {}
  ~ComputationGuard() override {
    if (auto core = core_.lock()) core->Abandon(id_);
  }
  std::string DebugString() const override {
    return absl::StrCat("BatcherComputationGuard(", id_, ")");
  }

 private:
  std::weak_ptr<BatcherCore> core_;
  const int64_t id_;
};

void BatcherCore::DeliverBatch(const std::weak_ptr<BatcherCore>& weak,
                               const RequestPtr& waiter,
                               const std::vector<RequestPtr>& batch,
                               int64_t id) {
  OpKernelContext* ctx = waiter->ctx;
  if (waiter->cm != nullptr && waiter->cm->IsCancelled()) {
    // The step that wanted this batch is gone (it was cancelled after the
    // batch was formed): give the inputs to the next BatcherGetInputs.
    if (auto core = weak.lock()) core->Requeue(id);
    Finish(waiter, errors::Cancelled("BatcherGetInputs was cancelled."));
    return;
  }
  const int64_t n = static_cast<int64_t>(batch.size());
  absl::Status status;
  const size_t num_inputs = batch[0]->inputs.size();
  for (size_t i = 0; i < num_inputs && status.ok(); ++i) {
    TensorShape shape = batch[0]->inputs[i].shape();
    shape.set_dim(0, n);
    Tensor* out = nullptr;
    status = ctx->allocate_output(static_cast<int>(i), shape, &out);
    // Each caller's tensors are kept alive by `batch` even if that caller
    // is cancelled meanwhile.
    for (int64_t j = 0; j < n && status.ok(); ++j) {
      status = tensorflow::batch_util::CopyContiguousSlices(
          batch[j]->inputs[i], 0, j, 1, out);
    }
  }
  if (status.ok()) {
    Tensor* id_out = nullptr;
    status = ctx->allocate_output(static_cast<int>(num_inputs),
                                  TensorShape({}), &id_out);
    if (status.ok()) id_out->scalar<int64_t>()() = id;
  }
  if (status.ok() && waiter->same_step_outputs &&
      ctx->step_container() != nullptr) {
    // Ownership of one ref passes to the resource manager either way.
    status = ctx->step_container()->Create(
        ctx->resource_manager(),
        absl::StrCat("batcher_computation_", reinterpret_cast<uintptr_t>(
                                                  weak.lock().get()),
                     "_", id),
        new ComputationGuard(weak, id));
  }
  if (!status.ok()) {
    // The batched computation will not run; fail its callers.
    if (auto core = weak.lock()) {
      std::vector<RequestPtr> callers;
      {
        mutex_lock l(core->mu_);
        auto it = core->in_flight_.find(id);
        if (it != core->in_flight_.end()) {
          callers = std::move(it->second.callers);
          core->in_flight_.erase(it);
        }
      }
      for (const RequestPtr& c : callers) {
        if (c != nullptr) Finish(c, status);
      }
    }
  }
  Finish(waiter, status);
}

// The resource: owns the core and its timeout thread.
class Batcher : public ResourceBase {
 public:
  Batcher(int64_t minimum_batch_size, int64_t maximum_batch_size,
          int64_t timeout_ms)
      : core_(std::make_shared<BatcherCore>(minimum_batch_size,
                                            maximum_batch_size, timeout_ms)) {
    if (core_->NeedsTimer()) {
      timer_ = std::thread([core = core_]() { core->TimerLoop(); });
    }
  }

  ~Batcher() override {
    core_->Close();  // ends TimerLoop
    if (timer_.joinable()) {
      // The timer thread holds its own reference to the core, so if this
      // destructor happens to run on it, detaching is safe.
      if (timer_.get_id() == std::this_thread::get_id()) {
        timer_.detach();
      } else {
        timer_.join();
      }
    }
  }

  std::string DebugString() const override {
    return absl::StrCat("Batcher(minimum_batch_size=",
                        core_->minimum_batch_size(),
                        ", maximum_batch_size=", core_->maximum_batch_size(),
                        ", timeout_ms=", core_->timeout_ms(), ")");
  }

  const std::shared_ptr<BatcherCore>& core() const { return core_; }

 private:
  std::shared_ptr<BatcherCore> core_;
  std::thread timer_;
};

// ---------------------------------------------------------------------------
// Kernels.

class BatcherOp : public ResourceOpKernel<Batcher> {
 public:
  explicit BatcherOp(OpKernelConstruction* c) : ResourceOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("minimum_batch_size", &minimum_batch_size_));
    OP_REQUIRES_OK(c, c->GetAttr("maximum_batch_size", &maximum_batch_size_));
    OP_REQUIRES_OK(c, c->GetAttr("timeout_ms", &timeout_ms_));
    OP_REQUIRES(c, minimum_batch_size_ >= 1,
                errors::InvalidArgument("Batcher: minimum_batch_size is ",
                                        minimum_batch_size_,
                                        "; it must be at least 1."));
    OP_REQUIRES(
        c, maximum_batch_size_ >= minimum_batch_size_,
        errors::InvalidArgument(
            "Batcher: maximum_batch_size (", maximum_batch_size_,
            ") is smaller than minimum_batch_size (", minimum_batch_size_,
            "); raise maximum_batch_size or lower minimum_batch_size."));
  }

 private:
  absl::Status CreateResource(Batcher** resource) override
      TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    *resource =
        new Batcher(minimum_batch_size_, maximum_batch_size_, timeout_ms_);
    return absl::OkStatus();
  }

  absl::Status VerifyResource(Batcher* resource) override {
    const BatcherCore& core = *resource->core();
    if (core.minimum_batch_size() != minimum_batch_size_ ||
        core.maximum_batch_size() != maximum_batch_size_ ||
        core.timeout_ms() != timeout_ms_) {
      return errors::InvalidArgument(
          "Batcher: shared_name refers to an existing ",
          resource->DebugString(), " with different options.");
    }
    return absl::OkStatus();
  }

  int64_t minimum_batch_size_ = 1;
  int64_t maximum_batch_size_ = 1;
  int64_t timeout_ms_ = -1;
};

absl::Status LookupBatcher(OpKernelContext* ctx,
                           tensorflow::core::RefCountPtr<Batcher>* batcher) {
  return tensorflow::LookupResource(ctx, tensorflow::HandleFromInput(ctx, 0),
                                    batcher);
}

class BatcherComputeOp : public AsyncOpKernel {
 public:
  explicit BatcherComputeOp(OpKernelConstruction* c) : AsyncOpKernel(c) {}

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    tensorflow::core::RefCountPtr<Batcher> batcher;
    OP_REQUIRES_OK_ASYNC(ctx, LookupBatcher(ctx, &batcher), done);
    OpInputList inputs;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->input_list("inputs", &inputs), done);
    std::vector<Tensor> tensors;
    tensors.reserve(inputs.size());
    for (int i = 0; i < inputs.size(); ++i) {
      const Tensor& t = inputs[i];
      OP_REQUIRES_ASYNC(
          ctx, t.dims() >= 1 && t.dim_size(0) == 1,
          errors::InvalidArgument(
              "BatcherCompute: input ", i, " has shape ", ShapeString(t),
              "; every input must have leading (batch) dimension 1."),
          done);
      tensors.push_back(t);
    }
    batcher->core()->Compute(ctx, std::move(done), std::move(tensors));
  }
};

class BatcherGetInputsOp : public AsyncOpKernel {
 public:
  explicit BatcherGetInputsOp(OpKernelConstruction* c) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("Tin", &dtypes_));
    OP_REQUIRES_OK(c, c->GetAttr("element_shapes", &element_shapes_));
    OP_REQUIRES(c,
                element_shapes_.empty() ||
                    element_shapes_.size() == dtypes_.size(),
                errors::InvalidArgument(
                    "BatcherGetInputs: element_shapes has ",
                    element_shapes_.size(), " entries but Tin has ",
                    dtypes_.size(), "; give one shape per input or none."));
    OP_REQUIRES_OK(c, c->GetAttr("batch_size", &batch_size_));
    OP_REQUIRES_OK(c, c->GetAttr("same_step_outputs", &same_step_outputs_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    tensorflow::core::RefCountPtr<Batcher> batcher;
    OP_REQUIRES_OK_ASYNC(ctx, LookupBatcher(ctx, &batcher), done);
    const BatcherCore& core = *batcher->core();
    // A static batch size is only a promise when every batch is full.
    OP_REQUIRES_ASYNC(
        ctx,
        batch_size_ < 0 || (core.minimum_batch_size() == batch_size_ &&
                            core.maximum_batch_size() == batch_size_ &&
                            core.timeout_ms() < 0),
        errors::InvalidArgument(
            "BatcherGetInputs: batch_size=", batch_size_, " but the ",
            batcher->DebugString(),
            " can form other batch sizes; a static batch_size needs "
            "minimum_batch_size == maximum_batch_size == batch_size and a "
            "negative timeout_ms."),
        done);
    batcher->core()->GetInputs(ctx, std::move(done), dtypes_,
                               element_shapes_, same_step_outputs_);
  }

 private:
  bool same_step_outputs_ = false;
  DataTypeVector dtypes_;
  std::vector<PartialTensorShape> element_shapes_;
  int64_t batch_size_ = -1;
};

class BatcherSetOutputsOp : public OpKernel {
 public:
  explicit BatcherSetOutputsOp(OpKernelConstruction* c) : OpKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    tensorflow::core::RefCountPtr<Batcher> batcher;
    OP_REQUIRES_OK(ctx, LookupBatcher(ctx, &batcher));
    const Tensor& id = ctx->input(1);
    OP_REQUIRES(ctx, tensorflow::TensorShapeUtils::IsScalar(id.shape()),
                errors::InvalidArgument(
                    "BatcherSetOutputs: computation_id must be a scalar, got ",
                    ShapeString(id), "."));
    OpInputList outputs;
    OP_REQUIRES_OK(ctx, ctx->input_list("outputs", &outputs));
    std::vector<Tensor> tensors(outputs.begin(), outputs.end());
    OP_REQUIRES_OK(ctx, batcher->core()->SetOutputs(id.scalar<int64_t>()(),
                                                    tensors));
  }
};

class BatcherCloseOp : public OpKernel {
 public:
  explicit BatcherCloseOp(OpKernelConstruction* c) : OpKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    tensorflow::core::RefCountPtr<Batcher> batcher;
    OP_REQUIRES_OK(ctx, LookupBatcher(ctx, &batcher));
    batcher->core()->Close();
  }
};

class BatcherStatsOp : public OpKernel {
 public:
  explicit BatcherStatsOp(OpKernelConstruction* c) : OpKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    tensorflow::core::RefCountPtr<Batcher> batcher;
    OP_REQUIRES_OK(ctx, LookupBatcher(ctx, &batcher));
    const std::vector<int64_t> stats = batcher->core()->Stats();
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({static_cast<int64_t>(stats.size())}),
                            &out));
    for (size_t i = 0; i < stats.size(); ++i) out->vec<int64_t>()(i) = stats[i];
  }
};

class BatcherLiveCountOp : public OpKernel {
 public:
  explicit BatcherLiveCountOp(OpKernelConstruction* c) : OpKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = live_cores.load();
  }
};

// ---------------------------------------------------------------------------
// Shape functions.

absl::Status ScalarHandle(InferenceContext* c) {
  ShapeHandle unused;
  return c->WithRank(c->input(0), 0, &unused);
}

absl::Status ComputeShapeFn(InferenceContext* c) {
  TF_RETURN_IF_ERROR(ScalarHandle(c));
  for (int i = 1; i < c->num_inputs(); ++i) {
    ShapeHandle shape;
    DimensionHandle unused;
    absl::Status s = c->WithRankAtLeast(c->input(i), 1, &shape);
    if (s.ok()) s = c->WithValue(c->Dim(shape, 0), 1, &unused);
    if (!s.ok()) {
      return errors::InvalidArgument(
          "BatcherCompute: input ", i - 1, " has shape ",
          c->DebugString(c->input(i)),
          "; every input must have leading (batch) dimension 1. ",
          s.message());
    }
  }
  // Each output is one row of the batched function's output: [1, ...]. Its
  // rank is unknown here; dynamic_batching.py sets the full static shape.
  for (int k = 0; k < c->num_outputs(); ++k) {
    c->set_output(k, c->UnknownShape());
  }
  return absl::OkStatus();
}

absl::Status GetInputsShapeFn(InferenceContext* c) {
  TF_RETURN_IF_ERROR(ScalarHandle(c));
  std::vector<PartialTensorShape> element_shapes;
  TF_RETURN_IF_ERROR(c->GetAttr("element_shapes", &element_shapes));
  int64_t batch_size;
  TF_RETURN_IF_ERROR(c->GetAttr("batch_size", &batch_size));
  const int num_inputs = c->num_outputs() - 1;
  if (!element_shapes.empty() &&
      static_cast<int>(element_shapes.size()) != num_inputs) {
    return errors::InvalidArgument("BatcherGetInputs: element_shapes has ",
                                   element_shapes.size(),
                                   " entries but Tin has ", num_inputs, ".");
  }
  const DimensionHandle batch =
      batch_size >= 0 ? c->MakeDim(batch_size) : c->UnknownDim();
  for (int i = 0; i < num_inputs; ++i) {
    ShapeHandle element = c->UnknownShape();
    if (!element_shapes.empty()) {
      TF_RETURN_IF_ERROR(
          c->MakeShapeFromPartialTensorShape(element_shapes[i], &element));
    }
    ShapeHandle out;
    TF_RETURN_IF_ERROR(c->Concatenate(c->Vector(batch), element, &out));
    c->set_output(i, out);
  }
  c->set_output(num_inputs, c->Scalar());
  return absl::OkStatus();
}

absl::Status SetOutputsShapeFn(InferenceContext* c) {
  TF_RETURN_IF_ERROR(ScalarHandle(c));
  ShapeHandle unused;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &unused));
  for (int i = 2; i < c->num_inputs(); ++i) {
    absl::Status s = c->WithRankAtLeast(c->input(i), 1, &unused);
    if (!s.ok()) {
      return errors::InvalidArgument(
          "BatcherSetOutputs: output ", i - 2, " has shape ",
          c->DebugString(c->input(i)),
          "; outputs of the batched function need a leading batch "
          "dimension.");
    }
  }
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("Batcher")
    .Output("handle: resource")
    .Attr("minimum_batch_size: int >= 1 = 1")
    .Attr("maximum_batch_size: int >= 1 = 1024")
    .Attr("timeout_ms: int = 100")
    .Attr("container: string = ''")
    .Attr("shared_name: string = ''")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape);

REGISTER_OP("BatcherCompute")
    .Input("handle: resource")
    .Input("inputs: Tin")
    .Output("outputs: Tout")
    .Attr("Tin: list(type) >= 1")
    .Attr("Tout: list(type) >= 0")
    .SetIsStateful()
    .SetShapeFn(ComputeShapeFn);

REGISTER_OP("BatcherGetInputs")
    .Input("handle: resource")
    .Output("inputs: Tin")
    .Output("computation_id: int64")
    .Attr("Tin: list(type) >= 1")
    .Attr("element_shapes: list(shape) = []")
    .Attr("batch_size: int = -1")
    .Attr("same_step_outputs: bool = false")
    .SetIsStateful()
    .SetShapeFn(GetInputsShapeFn);

REGISTER_OP("BatcherSetOutputs")
    .Input("handle: resource")
    .Input("computation_id: int64")
    .Input("outputs: Tout")
    .Attr("Tout: list(type) >= 0")
    .SetIsStateful()
    .SetShapeFn(SetOutputsShapeFn);

REGISTER_OP("BatcherClose")
    .Input("handle: resource")
    .SetIsStateful()
    .SetShapeFn(ScalarHandle);

REGISTER_OP("BatcherStats")
    .Input("handle: resource")
    .Output("stats: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarHandle(c));
      c->set_output(0, c->Vector(3));
      return absl::OkStatus();
    });

REGISTER_OP("BatcherLiveCount")
    .Output("count: int64")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape);

REGISTER_KERNEL_BUILDER(Name("Batcher").Device(DEVICE_CPU), BatcherOp);
REGISTER_KERNEL_BUILDER(Name("BatcherCompute").Device(DEVICE_CPU),
                        BatcherComputeOp);
REGISTER_KERNEL_BUILDER(Name("BatcherGetInputs").Device(DEVICE_CPU),
                        BatcherGetInputsOp);
REGISTER_KERNEL_BUILDER(Name("BatcherSetOutputs").Device(DEVICE_CPU),
                        BatcherSetOutputsOp);
REGISTER_KERNEL_BUILDER(Name("BatcherClose").Device(DEVICE_CPU),
                        BatcherCloseOp);
REGISTER_KERNEL_BUILDER(Name("BatcherStats").Device(DEVICE_CPU),
                        BatcherStatsOp);
REGISTER_KERNEL_BUILDER(Name("BatcherLiveCount").Device(DEVICE_CPU),
                        BatcherLiveCountOp);

}  // namespace scalable_agent

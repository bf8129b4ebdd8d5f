#include "engine_harness.h"

#include "sched/zero_engine.h"

namespace zoe::test {

Result<MlpRun> run_mlp(const Config& c, Comm& comm, int steps) {
  MlpModel model(c.n_layer, c.n_embd, 99);
  auto source = make_synthetic_source(c.micro_batch, comm.rank(), comm.size());
  return run_model(c, comm, steps, model, *source);
}

Result<MlpRun> run_model(const Config& c, Comm& comm, int steps, Model& model, BatchSource& source) {
  CpuDevice dev(c.device_memory_budget, c.host_memory_budget);
  // Communication staging is booked in this run's ledger, and unbooked before the ledger goes.
  comm.set_ledger(&dev.ledger());
  struct Unbook {
    Comm& c;
    ~Unbook() { c.set_ledger(nullptr); }
  } unbook{comm};
  auto units = model.units();
  ZeroEngine engine(c, dev, comm, units);
  ZOE_RETURN_IF_ERROR(engine.allocate());
  std::vector<float> buf;
  for (int u = 0; u < engine.num_units(); ++u) {
    buf.resize(engine.unit(u).numel);
    model.init_unit(u, c.seed, buf.data());
    ZOE_RETURN_IF_ERROR(engine.set_params(u, buf.data()));
  }
  MlpRun run;
  run.padded = engine.layout().padded_params();
  run.shard = engine.layout().shard_size();
  for (int s = 0; s < steps; ++s) {
    comm.reset_counters();
    double loss = 0;
    for (int m = 0; m < c.grad_accum; ++m) {
      ZOE_ASSIGN_OR_RETURN(Batch b, source.next());
      ZOE_ASSIGN_OR_RETURN(double l, model.train_micro_step(engine, b, static_cast<float>(engine.loss_scale())));
      loss += l;
    }
    ZOE_ASSIGN_OR_RETURN(StepResult r, engine.step(c.lr));
    (void)r;
    run.losses.push_back(loss);
    run.comm.push_back(comm.bytes_sent());
  }
  run.ledger = dev.ledger().snapshot();
  for (int u = 0; u < engine.num_units(); ++u) {
    ZOE_ASSIGN_OR_RETURN(ParamView p, engine.fetch(u));
    size_t at = run.params.size();
    run.params.resize(at + p.numel);
    weights_to_f32(p.data, p.dtype, p.numel, run.params.data() + at);
    ZOE_RETURN_IF_ERROR(engine.release(u));
  }
  return run;
}

}  // namespace zoe::test

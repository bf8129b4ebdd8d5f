/* Trains the MLP test model through zoe's C API alone (C99, compiled against the installed
 * header and library), and checks every step against a plain-C AdamW reference that computes all
 * ranks' gradients itself: losses and final weights must agree to 1e-5 relative.
 *
 *   mlp_c99 <stage> [nvme_dir]       run under mpirun -np N (or alone: one rank)
 *
 * The model: L layers of width D, y = g * (x W + b), tanh between layers, loss 1/2 mean squared
 * error to a fixed target. Layer l is unit "layer<l>" with tensors w [D,D], b [D], g [1]. Even
 * layers hand their gradient over as one flat tensor, odd ones parameter by parameter (b as
 * float64, w through a transposed, strided view) to reach each path of zoe_grads_ready. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zoe/zoe.h>

enum { L = 3, D = 8, B = 4, STEPS = 10 };
enum { NW = D * D, NU = NW + D + 1 }; /* elements per unit: w, b, g */
static const double LR = 1e-2, B1 = 0.9, B2 = 0.999, EPS = 1e-8, WD = 0.01;

#define CHECK(call)                                                                       \
  do {                                                                                    \
    zoe_status s_ = (call);                                                               \
    if (s_ != ZOE_OK) {                                                                   \
      fprintf(stderr, "%s:%d: %s failed (%d): %s\n", __FILE__, __LINE__, #call, (int)s_,  \
              zoe_last_error());                                                          \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

static void sample(long s, float* x, float* t) {
  for (int i = 0; i < D; ++i) x[i] = (float)sin(0.37 * (s + 1) * (i + 1));
  for (int j = 0; j < D; ++j) t[j] = (float)(0.5 * cos(0.11 * (s + 1) + 0.3 * j));
}

/* One layer forward on a batch: y = g (x W + b); act = tanh(y) unless last. */
static void layer_forward(const float* u, const float* x, float* y, float* act, int last) {
  for (int n = 0; n < B; ++n)
    for (int j = 0; j < D; ++j) {
      float z = u[NW + j];
      for (int i = 0; i < D; ++i) z += x[n * D + i] * u[i * D + j];
      y[n * D + j] = u[NW + D] * z;
      act[n * D + j] = last ? y[n * D + j] : tanhf(y[n * D + j]);
    }
}

/* dact: gradient w.r.t. the layer's output act; fills grad (NU) and dx (gradient w.r.t. x). */
static void layer_backward(const float* u, const float* x, const float* y, const float* act, const float* dact,
                           int last, float* grad, float* dx) {
  memset(grad, 0, NU * sizeof(float));
  memset(dx, 0, B * D * sizeof(float));
  for (int n = 0; n < B; ++n)
    for (int j = 0; j < D; ++j) {
      float dy = last ? dact[n * D + j] : dact[n * D + j] * (1 - act[n * D + j] * act[n * D + j]);
      float g = u[NW + D], z = y[n * D + j] / (g != 0 ? g : 1);
      grad[NW + D] += dy * z;
      float dz = dy * g;
      grad[NW + j] += dz;
      for (int i = 0; i < D; ++i) {
        grad[i * D + j] += dz * x[n * D + i];
        dx[n * D + i] += dz * u[i * D + j];
      }
    }
}

/* Loss and dout of a batch: 1/2 mean over samples of the squared error. */
static double loss_grad(const float* out, const float* t, float* dout) {
  double l = 0;
  for (int k = 0; k < B * D; ++k) {
    float e = out[k] - t[k];
    l += 0.5 * e * e / B;
    dout[k] = e / B;
  }
  return l;
}

static void batch(int step, int rank, int world, float* x, float* t) {
  for (int n = 0; n < B; ++n) sample(((long)step * world + rank) * B + n, x + n * D, t + n * D);
}

/* The reference: whole-model forward and backward on host arrays. */
static double ref_grad(float (*p)[NU], int step, int rank, int world, float (*grad)[NU]) {
  float x[B * D], t[B * D], ys[L][B * D], acts[L + 1][B * D], d[B * D], dx[B * D];
  batch(step, rank, world, acts[0], t);
  for (int l = 0; l < L; ++l) layer_forward(p[l], acts[l], ys[l], acts[l + 1], l == L - 1);
  double loss = loss_grad(acts[L], t, d);
  for (int l = L - 1; l >= 0; --l) {
    layer_backward(p[l], acts[l], ys[l], acts[l + 1], d, l == L - 1, grad[l], dx);
    memcpy(d, dx, sizeof d);
  }
  (void)x;
  return loss;
}

static void ref_adamw(float (*p)[NU], float (*g)[NU], float (*m)[NU], float (*v)[NU], int t) {
  double bc1 = 1 - pow(B1, t), bc2 = 1 - pow(B2, t);
  for (int l = 0; l < L; ++l)
    for (int k = 0; k < NU; ++k) {
      if (k < NW) p[l][k] = (float)(p[l][k] * (1 - LR * WD)); /* decay: w only */
      m[l][k] = (float)(B1 * m[l][k] + (1 - B1) * g[l][k]);
      v[l][k] = (float)(B2 * v[l][k] + (1 - B2) * g[l][k] * g[l][k]);
      p[l][k] = (float)(p[l][k] - LR * (m[l][k] / bc1) / (sqrt(v[l][k] / bc2) + EPS));
    }
}

static DLTensor host_f32(float* data, int ndim, int64_t* shape, int64_t* strides) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = ndim;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  t.strides = strides;
  return t;
}

static int rel_ok(double a, double b, const char* what, int step) {
  double r = fabs(a - b) / (fabs(b) > 1e-6 ? fabs(b) : 1e-6);
  if (r > 1e-5) fprintf(stderr, "step %d: %s %.9g vs reference %.9g (rel %.2g)\n", step, what, a, b, r);
  return r <= 1e-5;
}

int main(int argc, char** argv) {
  int stage = argc > 1 ? atoi(argv[1]) : 3;
  char cfg[1024], offload[512] = "";
  if (argc > 2) /* the optimizer state on NVMe; at stage 3 the parameters too */
    snprintf(offload, sizeof offload,
             ", \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"%s\"}%s%s%s", argv[2],
             stage == 3 ? ", \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"" : "",
             stage == 3 ? argv[2] : "", stage == 3 ? "\"}" : "");
  snprintf(cfg, sizeof cfg,
           "{\"train_micro_batch_size_per_gpu\": %d, \"zero_optimization\": {\"stage\": %d%s},"
           " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": %g, \"weight_decay\": %g}}}",
           B, stage, offload, LR, WD);
  zoe_engine* e = NULL;
  CHECK(zoe_engine_new(cfg, &e));
  int rank = zoe_rank(e), world = zoe_world_size(e);
  DLDataType f32 = {kDLFloat, 32, 1};
  char unit[32], name[L][3][32];
  for (int l = 0; l < L; ++l) {
    int64_t sw[2] = {D, D}, sb[1] = {D}, sg[1] = {1};
    snprintf(unit, sizeof unit, "layer%d", l);
    snprintf(name[l][0], 32, "layer%d.w", l);
    snprintf(name[l][1], 32, "layer%d.b", l);
    snprintf(name[l][2], 32, "layer%d.g", l);
    CHECK(zoe_register_param(e, unit, name[l][0], 2, sw, f32, 1));
    CHECK(zoe_register_param(e, unit, name[l][1], 1, sb, f32, 0));
    CHECK(zoe_register_param(e, unit, name[l][2], 1, sg, f32, 0));
  }
  CHECK(zoe_start(e));

  static float ref[L][NU], m[L][NU], v[L][NU], rg[L][NU], g1[L][NU];
  for (int l = 0; l < L; ++l) {
    for (int k = 0; k < NU; ++k) ref[l][k] = (float)(0.4 * sin(1.7 * k + 3.1 * l));
    ref[l][NW + D] = 1.0f;
    /* w goes in through a transposed view: column-major storage, strides {1, D} */
    float wt[NW];
    for (int i = 0; i < D; ++i)
      for (int j = 0; j < D; ++j) wt[j * D + i] = ref[l][i * D + j];
    int64_t sw[2] = {D, D}, st[2] = {1, D}, sb[1] = {D}, sg[1] = {1};
    DLTensor tw = host_f32(wt, 2, sw, st), tb = host_f32(ref[l] + NW, 1, sb, NULL),
             tg = host_f32(ref[l] + NW + D, 1, sg, NULL);
    CHECK(zoe_set_param(e, name[l][0], &tw));
    CHECK(zoe_set_param(e, name[l][1], &tb));
    CHECK(zoe_set_param(e, name[l][2], &tg));
  }

  int ok = 1;
  for (int step = 0; step < STEPS; ++step) {
    float t[B * D], ys[L][B * D], acts[L + 1][B * D], d[B * D], dx[B * D], grad[NU];
    batch(step, rank, world, acts[0], t);
    for (int l = 0; l < L; ++l) {
      DLManagedTensor* p = NULL;
      CHECK(zoe_fetch(e, l, &p));
      if (p->dl_tensor.ndim != 1 || p->dl_tensor.shape[0] != NU || p->dl_tensor.dtype.bits != 32) {
        fprintf(stderr, "zoe_fetch: unexpected tensor\n");
        return 1;
      }
      layer_forward((const float*)p->dl_tensor.data, acts[l], ys[l], acts[l + 1], l == L - 1);
      p->deleter(p);
      CHECK(zoe_release(e, l));
    }
    double loss = loss_grad(acts[L], t, d);
    for (int l = L - 1; l >= 0; --l) {
      DLManagedTensor* p = NULL;
      CHECK(zoe_fetch(e, l, &p));
      layer_backward((const float*)p->dl_tensor.data, acts[l], ys[l], acts[l + 1], d, l == L - 1, grad, dx);
      memcpy(d, dx, sizeof d);
      p->deleter(p);
      if (l % 2 == 0) {
        int64_t sh[1] = {NU};
        DLTensor tg = host_f32(grad, 1, sh, NULL);
        CHECK(zoe_grads_ready(e, l, &tg));
      } else {
        double gb[D];
        float gwt[NW];
        for (int j = 0; j < D; ++j) gb[j] = grad[NW + j];
        for (int i = 0; i < D; ++i)
          for (int j = 0; j < D; ++j) gwt[j * D + i] = grad[i * D + j];
        int64_t sw[2] = {D, D}, st[2] = {1, D}, sb[1] = {D}, sg[1] = {1};
        DLTensor tw = host_f32(gwt, 2, sw, st), tb = host_f32(NULL, 1, sb, NULL), tgg = host_f32(grad + NW + D, 1, sg, NULL);
        tb.data = gb;
        tb.dtype.bits = 64;
        CHECK(zoe_grad_param(e, name[l][0], &tw));
        CHECK(zoe_grad_param(e, name[l][1], &tb));
        CHECK(zoe_grad_param(e, name[l][2], &tgg));
        CHECK(zoe_grads_ready(e, l, NULL));
      }
      CHECK(zoe_release(e, l));
    }
    zoe_step_result res;
    CHECK(zoe_step(e, -1, &res));

    /* the reference: every rank's gradient, averaged, then AdamW */
    double ref_loss = 0;
    memset(rg, 0, sizeof rg);
    for (int r = 0; r < world; ++r) {
      double lr_ = ref_grad(ref, step, r, world, g1);
      if (r == rank) ref_loss = lr_;
      for (int l = 0; l < L; ++l)
        for (int k = 0; k < NU; ++k) rg[l][k] += g1[l][k] / world;
    }
    ref_adamw(ref, rg, m, v, step + 1);
    ok &= rel_ok(loss, ref_loss, "loss", step);
    ok &= res.applied == 1 && res.step == step + 1;
    if (rank == 0) printf("step %d loss %.6f (reference %.6f) grad_norm %.5f\n", step, loss, ref_loss, res.grad_norm);
  }
  for (int l = 0; l < L; ++l) { /* the trained weights themselves */
    DLManagedTensor* p = NULL;
    CHECK(zoe_fetch(e, l, &p));
    const float* w = (const float*)p->dl_tensor.data;
    for (int k = 0; k < NU; ++k) ok &= rel_ok(w[k] + 1.0, ref[l][k] + 1.0, "weight", STEPS);
    p->deleter(p);
    CHECK(zoe_release(e, l));
  }
  char* stats = NULL;
  CHECK(zoe_stats_json(e, &stats));
  if (rank == 0) printf("stats %s\n", stats);
  zoe_free_string(stats);
  CHECK(zoe_engine_close(e)); /* the last update's error, if it failed */
  if (rank == 0) printf("%s: stage %d, %d rank(s)%s\n", ok ? "PASS" : "FAIL", stage, world, argc > 2 ? ", nvme" : "");
  return ok ? 0 : 1;
}

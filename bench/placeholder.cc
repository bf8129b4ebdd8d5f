void zoe_bench_placeholder() {}

"""Dev-only patches of lib/csrc/dense_persistent.cu for run s10c (applied to copies of the tree).
  marks   the traced forward marks finer boundaries (the untraced kernel is unchanged):
          0 step start | 1 expect + product-free epilogue done | 2 staging issued |
          3 first slice arrived | 4 partial sums complete | 5 published
  spread  each warp's lane 0 expects the slice of one source (not lanes 0-15 of warp 0)
  last    the last warp's lane 0 issues the multicast (not thread 0)
  stagelast  the input staging's copies issued by the last warps (not the first)"""
import sys
path, *what = sys.argv[1:]
s = open(path).read()


def rep(old, new):
    global s
    assert s.count(old) == 1, old
    s = s.replace(old, new)


if "marks" in what:
    rep("""      pre_g[k] = Epi::gate(to_float(in[C::kSlice + j]));
    }
    cta.stage_inputs(t + kLead, p, t + kLead, t + kLead >= p.steps);
    jitter(t, 2);
    if (t == 0) mark<kTrace>(p, t, 1);
    cta.multiply(t, t - 1, [&] { mark<kTrace>(p, t, 1); });  // h_{t-1}: exchange t - 1 (h0 at t = 0)
    mark<kTrace>(p, t, 2);
    jitter(t, 3);
    __syncthreads();  // partial sums complete
    mark<kTrace>(p, t, 3);""", """      pre_g[k] = Epi::gate(to_float(in[C::kSlice + j]));
    }
    mark<kTrace>(p, t, 1);
    cta.stage_inputs(t + kLead, p, t + kLead, t + kLead >= p.steps);
    jitter(t, 2);
    mark<kTrace>(p, t, 2);
    if (t == 0) mark<kTrace>(p, t, 3);
    cta.multiply(t, t - 1, [&] { mark<kTrace>(p, t, 3); });
    jitter(t, 3);
    __syncthreads();  // partial sums complete
    mark<kTrace>(p, t, 4);""")
    rep("""      ob[k] = __float2bfloat16_rn(h * pre_g[k]);
    }
    mark<kTrace>(p, t, 4);""", """      ob[k] = __float2bfloat16_rn(h * pre_g[k]);
    }""")
if "spread" in what:
    rep("""    if (int(threadIdx.x) < kRanks)
      mbar_expect(&bar()[((e + 1) & 1) * kRanks + threadIdx.x], kBlockBytes);""",
        """    const int w = int(threadIdx.x) >> 5;
    if (lane() == 0 && w < kRanks) mbar_expect(&bar()[((e + 1) & 1) * kRanks + w], kBlockBytes);""")
if "last" in what:
    rep("""    if (threadIdx.x == 0)
      bulk_multicast(""", """    if (int(threadIdx.x) == kThreads - 32)
      bulk_multicast(""")
if "stagelast" in what:
    rep("""    for (int c = threadIdx.x; !skip && c < kIn * kChunks; c += kThreads) {""",
        """    for (int c = kThreads - 1 - int(threadIdx.x); !skip && c < kIn * kChunks; c += kThreads) {""")
open(path, "w").write(s)
print(path, "patched:", what)

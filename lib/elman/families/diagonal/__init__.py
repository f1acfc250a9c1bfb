"""The diagonal family: elementwise recurrences with no GEMM inside the time loop (E34, E61,
E62, E64, E65, E67, E68). One kernel walks the whole sequence per (sequence, channel block);
a variant is one step functor of lib/csrc/diagonal/steps.cuh. Chapter:
book/chapters/diagonal_family.md."""

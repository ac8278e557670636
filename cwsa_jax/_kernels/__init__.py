"""The backend-specific kernels, behind one dispatch module.

``_dispatch`` holds :class:`~cwsa_jax._kernels._dispatch.Kernels`, the explicit
configuration every internal entry point takes (``kernels=``), and its ``pick``, the one
place a form is chosen per platform. The kernels it chooses among: ``_dense`` (Pallas
bucket sums of binary samples, few buckets, CUDA), ``_sorted_sums`` (one sort and prefix
sums, many buckets, accelerators), ``_group_areas`` (a Pallas kernel for the AURC family
after the sort, CUDA) and ``_sort`` (the sorts: NumPy's on the CPU host, ``lax.sort``
elsewhere). They compute sums, orders and areas and never call back into the metric
modules that use them.
"""

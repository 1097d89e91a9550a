"""The sizes relattn's relative-position kernels (``_triton.py``, ``_pallas.py``) hold in a
tile: the kernels check them, and the plan (``_relative.py``) refuses the kernels beyond
them."""

#: The feature sizes the kernels' tiles hold (FlashAttention's bound); both kernels check it.
MAX_HEAD_DIM = 256
#: The key grid's rows and columns (the grid terms): the Triton kernel holds a query tile's
#: gradients of each in registers.
MAX_GRID = 256

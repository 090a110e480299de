"""What a request may ask for, defined once for `cvae sample`, the grid code and the service.

Plain numbers with no imports, so the CLI reads them without loading NumPy or JAX. The layout
they bound is `cvae.sampling.grid`'s (torchvision's `make_grid` convention, docs/design.md "HTTP
service").
"""

# A model's classes: 2..MAX_CLASSES (its dataset's). A flag or a query parameter that takes a
# class by index accepts 0..MAX_CLASSES - 1 before it knows the model; each then checks the
# model's own class count (the service's `check_labels`, `Sampler.sample_images`).
MAX_CLASSES = 1000

MAX_N = 1024  # samples per class, and grid columns: 1..MAX_N
DEFAULT_N = 16
MAX_SCALE = 8  # integer upscale of each tile (28x28 for MNIST): 1..MAX_SCALE
DEFAULT_SCALE = 1
MAX_PAD = 8  # px of background around every tile: 0..MAX_PAD
DEFAULT_PAD = 2
MAX_TEMPERATURE = 2.0  # z ~ N(0, t^2 I) with 0 < t <= MAX_TEMPERATURE
DEFAULT_TEMPERATURE = 1.0
# Seeds are 32-bit: without jax_enable_x64 a key keeps only 32 bits of its seed, so larger
# values would silently collide with smaller ones. Training, sampling, eval and the service
# share this range.
MAX_SEED = 2**32 - 1

# Style transfer (`POST /transfer`) and interpolation (`GET /interpolate`).
MAX_UPLOAD_BYTES = 8 * 2**20  # request body: a phone photo fits; more is refused while reading
MAX_INPUT_PIXELS = 4096 * 4096  # width x height from the header, checked before decoding
MAX_POSTERIOR_SAMPLES = 64  # transfer: 0 = posterior mean, else k posterior draws (rows)
DEFAULT_STEPS = 10  # interpolation: tiles along the latent path, endpoints included
MAX_STEPS = 64

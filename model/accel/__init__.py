"""GPU speed transforms of the model, applied from outside (see transforms.py)."""
from model.accel.options import AccelOptions
from model.accel.transforms import enable_fp8, fp8_supported, optimize_dit, optimize_vae

__all__ = ["AccelOptions", "enable_fp8", "fp8_supported", "optimize_dit", "optimize_vae"]

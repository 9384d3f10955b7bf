"""diffusers-ascend: run Hugging Face diffusers pipelines fast on Huawei Ascend NPUs."""

__version__ = "0.1.0"

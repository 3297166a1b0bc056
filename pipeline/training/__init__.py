"""Training engines: the resumable loop, public EDM pretraining and the DP-SGD training of a denoiser
(:mod:`.dp_denoiser`, stage ``train_dpdm``: DPDM's, and the engine of the DP-SGD baselines)."""

#: the denoiser engine's param ``unet`` value for the architecture of the public denoiser the run starts from (input
#: ``init``): here, torch-free, so the wirings that pass it and the stage that reads it share one constant
UNET_FROM_INIT = "init"

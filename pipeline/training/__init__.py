"""Training: the resumable loop, public EDM pretraining and DPDM's DP-SGD training stages."""

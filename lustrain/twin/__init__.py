"""The local twin: the whole stack on one machine, on moto, with a real PyTorch run for the training job."""

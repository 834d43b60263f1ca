"""The PyTorch trainer that lustrain ships to SageMaker as sourcedir.tar.gz.

It depends on torch, numpy and the standard library only: it runs inside the SageMaker PyTorch container,
where none of the control plane is installed.
"""

"""SageMaker's entry point (sagemaker_program): `python train.py --key value ...`, alone or under torchrun.

SageMaker runs it from the extracted sourcedir, where lustrain_trainer sits beside it on sys.path.
"""

import sys

from lustrain_trainer.trainer import main

if __name__ == "__main__":
    sys.exit(main())

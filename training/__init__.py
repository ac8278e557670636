"""Flax NNX models and training of MNIST and CIFAR-10 CNNs with CWSA evaluation."""

"""Deployable programs of a trained model (`tdiff export`): torch.export, TorchScript, ONNX, slim
safetensors, each verified against the source.
"""

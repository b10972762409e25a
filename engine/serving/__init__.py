"""Serving configs as TensorRT-LLM reads them: the files, their layouts, upstream's strict sections,
the model each server runs, and one config checked under one policy."""

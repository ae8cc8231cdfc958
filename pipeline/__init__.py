"""iobatch: AWS Batch pipeline for ML training data that profiles its own I/O."""

"""What is stored: the codec (type-preserving JSON; encoder and decoder), redaction and
secrets, the model fields that hold codec text, and the renderings and argument versions
derived from stored values. Below everything else in the engine.
"""

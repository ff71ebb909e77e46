"""The tool's primitives: canonical JSON and digests, errors, atomic files, the frozen base
model, the repository and cache roots. Imports nothing of ours."""

"""The LoRA merge stage: fold the trained adapter into its base model, prove it, save a complete HF directory.

``lora`` merges and installs the directory, ``inputs`` checks what it starts from, ``proofs`` holds the
checks it must pass, ``output`` the directory's other files and its record (``merge_record.json``,
``MergeReport``), ``memory`` refuses a merge the machine has no room for, and ``job_entry`` is the Ray
job (``python -m mazerl.merge.job_entry``) the pipeline's merge stage submits.
"""

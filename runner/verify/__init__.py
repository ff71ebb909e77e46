"""The frozen-state audit: an Ansible check-mode playbook from the freeze manifest, its drifts."""

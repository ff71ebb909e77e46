"""One cell: the Harbor command in the guest under a deadline, copy-back, classification and
the accounting of provider POSTs against logical attempts."""

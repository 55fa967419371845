"""The operator's read/act layer: queues, the sorted sets, processes and totals
(re-exported as :mod:`forkq.api`), and the CLI's commands and tables on top of them."""

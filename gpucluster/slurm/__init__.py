"""Slurm on the provisioned nodes: what each node has (facts), the files built from it
(config), and the checks that the cluster answers (verify). Provision's slurm step and
`export sbatch` use them; they import nothing of provision."""

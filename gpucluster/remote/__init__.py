"""Running commands on hosts: one interface (`Connection`), SSH and local implementations,
and a bounded, interruptible fan-out over many hosts."""

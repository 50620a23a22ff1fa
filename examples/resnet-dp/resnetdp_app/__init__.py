"""resnet-dp: a GroupNorm ResNet-18 on CIFAR-shaped generated images, record-level DP-SGD in every client and
client-level central DP on the server, booked in one privacy ledger."""

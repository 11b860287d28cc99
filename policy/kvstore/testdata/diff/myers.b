c
b
a
b
a
c

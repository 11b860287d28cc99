rules: []
x: 2